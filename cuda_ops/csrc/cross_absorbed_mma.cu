// Absorbed cross-attention, z = softmax(qa X^T) X, hand-written for tensor cores (mma.sync m16n8k16,
// fp16 in, fp32 accumulation): cuda_ops/cross_absorbed_mma.py compiles it with NVRTC and launches it.
//
// One block of WARPS warps (8, or 16 where D / 16 is a multiple of 16) takes one row's group of up to NT * 8 query rows (a decode step's 20 heads: NT
// = 3) over a span of positions. Positions are the products' M, so the skinny side (the queries) is N,
// padded to 8, not 16 or 64:
//   scores^T [BT positions, N] = X_tile [BT, D] . qa^T [D, N]   (warps split D; partial sums meet in smem)
//   z^T [D, N] += X_tile^T [D, BT] . P [BT, N]                   (warps split D; each holds its D/WARPS rows)
// so each BT x D tile of X, staged in shared memory by cp.async STAGES - 1 tiles ahead, feeds both products
// from shared memory (ldmatrix, ldmatrix.trans) and X is read from global memory once. BT is 32 or 16: a
// block (one an SM) keeps STAGES - 1 tiles in flight while it works on one, and at D 1280 only two 32-row
// tiles fit (80 KB each), so one tile's latency went unhidden every tile (~2.5 TB/s on the H200); five
// 16-row stages keep four in flight. The queries' fragments
// stay in registers for the whole span. Shared memory rows are swizzled by 16-byte chunk (chunk ^ row % 8)
// so that ldmatrix's eight rows hit eight different bank groups.
//
// No headers: NVRTC compiles it as it is (raw fp16 bits as unsigned short, conversions in PTX).

typedef unsigned short f16;
typedef unsigned int u32;

#define NMAX 24        // query rows a block at most (3 n8 tiles)
#define PSTRIDE 40     // halves a row of P in shared memory (32 + 8: conflict-free 32-bit reads; BT <= 32)
#define RSTRIDE 26     // floats a position of the partial scores (24 + 2)
#define LOG2E 1.4426950408889634f

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void ldm_x4(u32 addr, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldm_x4_trans(u32 addr, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ f16 to_f16(float x) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Issue the cp.async loads of positions [t0, t0 + BT) (rows past t_hi zero-filled) into a stage.
template <int D, int BT, int THREADS>
__device__ __forceinline__ void load_tile(f16* stage, const f16* xw, long long s_xt, int t0, int t_hi) {
    constexpr int CH = D / 8;  // 16-byte chunks a row
#pragma unroll
    for (int i = threadIdx.x; i < BT * CH; i += THREADS) {
        int row = i / CH, c = i % CH;
        int t = t0 + row;
        bool ok = t < t_hi;
        const f16* src = xw + (ok ? (long long)t * s_xt : 0) + c * 8;
        cp_async16(smem_u32(stage + row * D + ((c ^ (row & 7)) << 3)), src, ok ? 16 : 0);
    }
}

// qa [B, HQ, D] (rows s_qb, s_qh apart), x [W, T, D] (s_xw, s_xt), windows [B] int32 (has_windows).
// Grid (B * groups, splits); group g of a row takes query rows g * HG ... (g + 1) * HG - 1 (HG <= NT * 8).
// normalize: out fp16 [B, HQ, D] (s_ob, s_oh); else out fp32 [B, splits, HQ, D] (s_ob, s_os, s_oh) with
// m (natural units) and l at [b * s_mb + split * HQ + head] for the merge of the spans.
template <int D, int BT, int NT, int STAGES, int WARPS, int LATE>
__global__ void __launch_bounds__(WARPS * 32, 1)
absorbed_mma(const f16* __restrict__ qa, const f16* __restrict__ x, const int* __restrict__ windows,
             void* __restrict__ out, float* __restrict__ m_out, float* __restrict__ l_out,
             int T, int span, int HQ, int HG, int groups, int s_qb, int s_qh, int s_xw, int s_xt,
             int s_ob, int s_os, int s_oh, int s_mb, int has_windows, int normalize) {
    constexpr int THREADS = WARPS * 32;
    constexpr int DW = D / WARPS;  // a warp's slice of the width
    constexpr int RW = (NMAX + WARPS - 1) / WARPS;  // query rows a warp owns in the softmax
    static_assert(DW % 16 == 0, "a warp's slice of the width is a multiple of 16");
    constexpr int KS = DW / 16;    // its k16 steps (scores) and m16 tiles (z)
    constexpr int MT = BT / 16;    // m16 tiles of positions (scores), k16 steps (z)
    static_assert(BT == 16 || BT == 32, "a tile is 16 or 32 positions");
    extern __shared__ __align__(128) unsigned char smem[];
    f16* xs = (f16*)smem;                                                      // [STAGES][BT][D]
    float* red = (float*)(smem + STAGES * BT * D * 2);                         // [WARPS][BT][RSTRIDE]
    f16* ps = (f16*)(red + WARPS * BT * RSTRIDE);                              // [NMAX][PSTRIDE]
    float* alpha_s = (float*)(ps + NMAX * PSTRIDE);                            // [NMAX]
    float* l_s = alpha_s + NMAX;                                               // [NMAX]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g8 = lane >> 2, t4 = lane & 3;
    const int b = blockIdx.x / groups, grp = blockIdx.x % groups;
    const int split = blockIdx.y;
    const int h0 = grp * HG;
    const int nh = min(HG, HQ - h0);
    const int w = has_windows ? windows[b] : b;
    const f16* xw = x + (long long)w * s_xw;
    const int t_lo = split * span;
    const int t_hi = min(T, t_lo + span);
    const int ntiles = (t_hi - t_lo + BT - 1) / BT;

    // The queries as the scores' B operand (k = width, n = query row), this warp's slice of the width.
    u32 qf[NT][KS][2];
    const f16* qrow = qa + (long long)b * s_qb;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        int h = n * 8 + g8;
        const f16* qh = qrow + (long long)(h0 + h) * s_qh + warp * DW + 2 * t4;
#pragma unroll
        for (int k = 0; k < KS; ++k) {
            qf[n][k][0] = h < nh ? *(const u32*)(qh + k * 16) : 0u;
            qf[n][k][1] = h < nh ? *(const u32*)(qh + k * 16 + 8) : 0u;
        }
    }
    float acc[KS][NT][4];
#pragma unroll
    for (int i = 0; i < KS; ++i)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][n][j] = 0.f;
    float m_run[RW], l_run[RW];  // the softmax state of query rows warp * RW + j (held by every lane)
#pragma unroll
    for (int j = 0; j < RW; ++j) {
        m_run[j] = -__int_as_float(0x7f800000);
        l_run[j] = 0.f;
    }

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntiles) load_tile<D, BT, THREADS>(xs + s * BT * D, xw, s_xt, t_lo + s * BT, t_hi);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int i = 0; i < ntiles; ++i) {
        // LATE: the next tile's loads go out after the barrier that says every warp is done with the stage
        // they overwrite (tile i - 1's), so no barrier ends the iteration (three a tile, not four); its
        // partial scores and P are rewritten only after later barriers.
        const int ahead = i + STAGES - 1;
        if (!LATE) {
            if (ahead < ntiles) load_tile<D, BT, THREADS>(xs + (ahead % STAGES) * BT * D, xw, s_xt, t_lo + ahead * BT, t_hi);
            asm volatile("cp.async.commit_group;\n" ::);
            asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1));
        } else {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        }
        __syncthreads();
        if (LATE) {
            if (ahead < ntiles) load_tile<D, BT, THREADS>(xs + (ahead % STAGES) * BT * D, xw, s_xt, t_lo + ahead * BT, t_hi);
            asm volatile("cp.async.commit_group;\n" ::);
        }
        const f16* tile = xs + (i % STAGES) * BT * D;
        const int t0 = t_lo + i * BT;

        // Partial scores over this warp's slice of the width: [BT positions, NT * 8 rows], MG m16 tiles of
        // positions a pass (16 warps: one, to stay within 128 registers a thread).
        constexpr int MG = WARPS > 8 ? 1 : MT;
        float* my_red = red + warp * BT * RSTRIDE;
#pragma unroll
        for (int m0 = 0; m0 < MT; m0 += MG) {
            float sc[MG][NT][4];
#pragma unroll
            for (int mi = 0; mi < MG; ++mi)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int j = 0; j < 4; ++j) sc[mi][n][j] = 0.f;
#pragma unroll
            for (int k = 0; k < KS; ++k) {
                const int chunk = (warp * DW + k * 16) / 8 + (lane >> 4);
#pragma unroll
                for (int mi = 0; mi < MG; ++mi) {
                    const int row = (m0 + mi) * 16 + (lane & 15);
                    u32 a[4];
                    ldm_x4(smem_u32(tile + row * D + ((chunk ^ (row & 7)) << 3)), a);
#pragma unroll
                    for (int n = 0; n < NT; ++n) mma16816(sc[mi][n], a, qf[n][k][0], qf[n][k][1]);
                }
            }
#pragma unroll
            for (int mi = 0; mi < MG; ++mi)
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const int p = (m0 + mi) * 16 + g8, h = n * 8 + 2 * t4;
                    my_red[p * RSTRIDE + h] = sc[mi][n][0];
                    my_red[p * RSTRIDE + h + 1] = sc[mi][n][1];
                    my_red[(p + 8) * RSTRIDE + h] = sc[mi][n][2];
                    my_red[(p + 8) * RSTRIDE + h + 1] = sc[mi][n][3];
                }
        }
        __syncthreads();

        // Online softmax: warp w owns query rows RW w .. RW w + RW - 1, a lane one position (lanes past BT none).
        const bool valid = lane < BT && t0 + lane < t_hi;
#pragma unroll
        for (int j = 0; j < RW; ++j) {
            const int h = warp * RW + j;
            if (h < NT * 8) {
                float s = 0.f;
#pragma unroll
                if (lane < BT)
                    for (int v = 0; v < WARPS; ++v) s += red[(v * BT + lane) * RSTRIDE + h];
                s = valid ? s * LOG2E : -__int_as_float(0x7f800000);
                const float m_new = fmaxf(m_run[j], warp_max(s));
                const float alpha = ex2(m_run[j] - m_new);
                const float p = ex2(s - m_new);
                l_run[j] = l_run[j] * alpha + warp_sum(p);
                m_run[j] = m_new;
                if (lane < BT) ps[h * PSTRIDE + lane] = to_f16(p);
                if (lane == 0) alpha_s[h] = alpha;
            }
        }
        __syncthreads();

        // z^T += X_tile^T . P over this warp's rows of the width.
        float al[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            al[n][0] = alpha_s[n * 8 + 2 * t4];
            al[n][1] = alpha_s[n * 8 + 2 * t4 + 1];
        }
#pragma unroll
        for (int ms = 0; ms < KS; ++ms)
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                acc[ms][n][0] *= al[n][0];
                acc[ms][n][1] *= al[n][1];
                acc[ms][n][2] *= al[n][0];
                acc[ms][n][3] *= al[n][1];
            }
#pragma unroll
        for (int kk = 0; kk < MT; ++kk) {
            u32 pb[NT][2];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const f16* pr = ps + (n * 8 + g8) * PSTRIDE + kk * 16 + 2 * t4;
                pb[n][0] = *(const u32*)pr;
                pb[n][1] = *(const u32*)(pr + 8);
            }
            const int mi = lane >> 3;
            const int row = kk * 16 + (lane & 7) + ((mi >> 1) << 3);
#pragma unroll
            for (int ms = 0; ms < KS; ++ms) {
                const int chunk = (warp * DW + ms * 16) / 8 + (mi & 1);
                u32 a[4];
                ldm_x4_trans(smem_u32(tile + row * D + ((chunk ^ (row & 7)) << 3)), a);
#pragma unroll
                for (int n = 0; n < NT; ++n) mma16816(acc[ms][n], a, pb[n][0], pb[n][1]);
            }
        }
        if (!LATE) __syncthreads();  // the stage, the partial scores and P are rewritten next
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < RW; ++j) {
            const int h = warp * RW + j;
            if (h < NT * 8) {
                l_s[h] = l_run[j];
                if (!normalize && h < nh) {
                    const long long ml = (long long)b * s_mb + (long long)split * HQ + h0 + h;
                    m_out[ml] = m_run[j] / LOG2E;
                    l_out[ml] = l_run[j];
                }
            }
        }
    }
    __syncthreads();
    // acc[ms][n]: (width warp * DW + ms * 16 + g8 (+8 for [2], [3]), rows n * 8 + 2 * t4 (+1 for [1], [3])).
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int h = n * 8 + 2 * t4 + c;
            if (h >= nh) continue;
            const float inv = normalize ? 1.f / l_s[h] : 1.f;
            const long long base = (long long)b * s_ob + (long long)(h0 + h) * s_oh + (normalize ? 0 : (long long)split * s_os);
#pragma unroll
            for (int ms = 0; ms < KS; ++ms) {
                const int d = warp * DW + ms * 16 + g8;
                if (normalize) {
                    f16* o = (f16*)out + base + d;
                    o[0] = to_f16(acc[ms][n][c] * inv);
                    o[8] = to_f16(acc[ms][n][2 + c] * inv);
                } else {
                    float* o = (float*)out + base + d;
                    o[0] = acc[ms][n][c];
                    o[8] = acc[ms][n][2 + c];
                }
            }
        }
}

// The spans of a row merged (absorbed_mma with normalize = 0 wrote them): z[b, h] = sum_s w_s part[b, s, h] /
// sum_s w_s l[b, s, h], w_s = exp(m[b, s, h] - max_s m[b, s, h]). One block a (row, query row), four widths a
// thread; part fp32 [B, splits, HQ, D], m and l [B, splits, HQ], z fp16 [B, HQ, D], all contiguous;
// splits <= MERGE_MAX. One pass over the partial sums instead of PyTorch's five.
#define MERGE_MAX 64
struct __align__(16) f32x4 { float x, y, z, w; };
__global__ void absorbed_merge(const float* __restrict__ part, const float* __restrict__ m,
                               const float* __restrict__ l, f16* __restrict__ z, int HQ, int D, int splits) {
    __shared__ float ws[MERGE_MAX];
    const int b = blockIdx.x / HQ, h = blockIdx.x % HQ;
    if (threadIdx.x == 0) {
        float top = -3.0e38f, den = 0.f;
        for (int s = 0; s < splits; ++s) top = fmaxf(top, m[((long long)b * splits + s) * HQ + h]);
        for (int s = 0; s < splits; ++s) {
            const long long i = ((long long)b * splits + s) * HQ + h;
            ws[s] = __expf(m[i] - top);
            den += ws[s] * l[i];
        }
        for (int s = 0; s < splits; ++s) ws[s] /= den;
    }
    __syncthreads();
    for (int d = threadIdx.x * 4; d < D; d += blockDim.x * 4) {
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        for (int s = 0; s < splits; ++s) {
            const f32x4 v = *(const f32x4*)(part + (((long long)b * splits + s) * HQ + h) * D + d);
            a0 += ws[s] * v.x;
            a1 += ws[s] * v.y;
            a2 += ws[s] * v.z;
            a3 += ws[s] * v.w;
        }
        f16* o = z + ((long long)b * HQ + h) * D + d;
        o[0] = to_f16(a0);
        o[1] = to_f16(a1);
        o[2] = to_f16(a2);
        o[3] = to_f16(a3);
    }
}

#ifdef ABSORBED_MMA_INSTANTIATE  // nvcc checks (registers, spills): nvcc -DABSORBED_MMA_INSTANTIATE -cubin
#define INSTANCE(D, BT, NT, S, W, L)                                                                                \
    template __global__ void absorbed_mma<D, BT, NT, S, W, L>(const f16*, const f16*, const int*, void*, float*,  \
                                                              float*, int, int, int, int, int, int, int, int,     \
                                                              int, int, int, int, int, int, int);
INSTANCE(1280, 32, 3, 2, 8, 0)
INSTANCE(1280, 32, 3, 2, 8, 1)
INSTANCE(1280, 32, 3, 2, 16, 0)
INSTANCE(1280, 16, 3, 5, 8, 1)
INSTANCE(384, 32, 3, 3, 8, 1)
INSTANCE(1024, 32, 2, 3, 16, 0)
#endif
