// Absorbed cross-attention, z = softmax(qa X^T) X, hand-written for tensor cores (mma.sync m16n8k16,
// fp16 in, fp32 accumulation): cuda_ops/cross_absorbed_mma.py compiles it with NVRTC and launches it.
//
// One block of 8 warps takes one row's group of up to NT * 8 query rows (a decode step's 20 heads: NT
// = 3) over a span of positions. Positions are the products' M, so the skinny side (the queries) is N,
// padded to 8, not 16 or 64:
//   scores^T [BT positions, N] = X_tile [BT, D] . qa^T [D, N]   (warps split D; partial sums meet in smem)
//   z^T [D, N] += X_tile^T [D, BT] . P [BT, N]                   (warps split D; each holds its D/8 rows)
// so each BT x D tile of X, staged in shared memory by cp.async STAGES - 1 tiles ahead, feeds both products
// from shared memory (ldmatrix, ldmatrix.trans) and X is read from global memory once. BT is 32 or 16 (a
// block, one an SM, keeps STAGES - 1 tiles in flight while it works on one); at D 1280 two 32-row stages
// fit, and deeper pipelines of 16-row tiles were slower: the block's instructions bound it, not memory
// latency (docs/kernels-attention-mel.md, session 31), hence the lean address arithmetic below. The queries' fragments
// stay in registers for the whole span. Shared memory rows are swizzled by 16-byte chunk (chunk ^ row % 8)
// so that ldmatrix's eight rows hit eight different bank groups.
//
// No headers: NVRTC compiles it as it is (raw fp16 bits as unsigned short, conversions in PTX).

typedef unsigned short f16;
typedef unsigned int u32;

#define NMAX 24        // query rows a block at most (3 n8 tiles)
#define WARPS 8
#define THREADS 256
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

// Issue the cp.async loads of positions [t0, t0 + BT) (rows past t_hi zero-filled) into the stage at shared
// address `stage`: warp w copies rows w * BT / WARPS ..., a lane 16-byte chunks lane, lane + 32, ... of each,
// so that every address is a per-thread base plus a constant (no division a chunk: ncu showed the integer
// pipe, not memory, the busiest in the per-chunk form), and a warp writes 512 contiguous bytes at once.
template <int D, int BT>
__device__ __forceinline__ void load_tile(u32 stage, const f16* xw, long long s_xt, int t0, int t_hi, int warp, int lane) {
    constexpr int CH = D / 8;              // 16-byte chunks a row
    constexpr int RPW = BT / WARPS;        // rows a warp
    constexpr int CPL = (CH + 31) / 32;    // chunks a lane a row
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        const int row = warp * RPW + r;
        const bool ok = t0 + row < t_hi;
        const f16* src = xw + (long long)(ok ? t0 + row : t0) * s_xt + lane * 8;
        const u32 dst = stage + row * (D * 2) + ((lane ^ (row & 7)) << 4);  // chunk c at (c ^ row % 8)
#pragma unroll
        for (int j = 0; j < CPL; ++j)
            if (CH % 32 == 0 || lane + 32 * j < CH) cp_async16(dst + j * 512, src + j * 256, ok ? 16 : 0);
    }
}

// qa [B, HQ, D] (rows s_qb, s_qh apart), x [W, T, D] (s_xw, s_xt), windows [B] int32 (has_windows).
// Grid (B * groups, splits); group g of a row takes query rows g * HG ... (g + 1) * HG - 1 (HG <= NT * 8).
// normalize: out fp16 [B, HQ, D] (s_ob, s_oh); else out fp32 [B, splits, HQ, D] (s_ob, s_os, s_oh) with
// m (natural units) and l at [b * s_mb + split * HQ + head] for the merge of the spans.
template <int D, int BT, int NT, int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
absorbed_mma(const f16* __restrict__ qa, const f16* __restrict__ x, const int* __restrict__ windows,
             void* __restrict__ out, float* __restrict__ m_out, float* __restrict__ l_out,
             int T, int span, int HQ, int HG, int groups, int s_qb, int s_qh, int s_xw, int s_xt,
             int s_ob, int s_os, int s_oh, int s_mb, int has_windows, int normalize) {
    constexpr int DW = D / WARPS;  // a warp's slice of the width
    constexpr int KS = DW / 16;    // its k16 steps (scores) and m16 tiles (z)
    constexpr int MT = BT / 16;    // m16 tiles of positions (scores), k16 steps (z)
    constexpr int RW = NMAX / WARPS;  // query rows a warp owns in the softmax
    static_assert(DW % 16 == 0 && NMAX % WARPS == 0, "a warp's slice of the width is a multiple of 16");
    static_assert(BT == 16 || BT == 32, "a tile is 16 or 32 positions");
    extern __shared__ __align__(128) unsigned char smem[];
    f16* xs = (f16*)smem;                                                      // [STAGES][BT][D]
    float* red = (float*)(smem + STAGES * BT * D * 2);                         // [WARPS][BT][RSTRIDE]
    f16* ps = (f16*)(red + WARPS * BT * RSTRIDE);                              // [NMAX][PSTRIDE]
    float* alpha_s = (float*)(ps + NMAX * PSTRIDE);                            // [NMAX]
    float* l_s = alpha_s + NMAX;                                               // [NMAX]
    const u32 xs_u32 = smem_u32(xs);

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
    // The softmax state of query rows warp * RW + j (held by every lane). Rows past NT * 8 are computed
    // from partial scores never written and never used: no branch, so the shuffles stay warp-uniform.
    float m_run[RW], l_run[RW];
#pragma unroll
    for (int j = 0; j < RW; ++j) {
        m_run[j] = -__int_as_float(0x7f800000);
        l_run[j] = 0.f;
    }
    // Per-lane parts of the ldmatrix addresses: scores read rows mt * 16 + lane % 16 at chunk base + 2k +
    // lane / 16; z reads rows kk * 16 + lane % 8 + 8 (lane / 16) at chunk base + 2 ms + (lane / 8) % 2.
    // Every row's swizzle is lane % 8.
    const int sw = lane & 7;
    const u32 a_row = (lane & 15) * (D * 2), t_row = ((lane & 7) + ((lane >> 4) << 3)) * (D * 2);
    const int a_chunk = warp * DW / 8 + (lane >> 4), t_chunk = warp * DW / 8 + ((lane >> 3) & 1);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntiles) load_tile<D, BT>(xs_u32 + s * BT * D * 2, xw, s_xt, t_lo + s * BT, t_hi, warp, lane);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int i = 0; i < ntiles; ++i) {
        const int ahead = i + STAGES - 1;
        if (ahead < ntiles)
            load_tile<D, BT>(xs_u32 + (ahead % STAGES) * BT * D * 2, xw, s_xt, t_lo + ahead * BT, t_hi, warp, lane);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1));
        __syncthreads();
        const u32 tile = xs_u32 + (i % STAGES) * BT * D * 2;
        const int t0 = t_lo + i * BT;

        // Partial scores over this warp's slice of the width: [BT positions, NT * 8 rows].
        float sc[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int j = 0; j < 4; ++j) sc[mt][n][j] = 0.f;
#pragma unroll
        for (int k = 0; k < KS; ++k) {
            const u32 col = ((a_chunk + 2 * k) ^ sw) << 4;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                u32 a[4];
                ldm_x4(tile + mt * 16 * (D * 2) + a_row + col, a);
#pragma unroll
                for (int n = 0; n < NT; ++n) mma16816(sc[mt][n], a, qf[n][k][0], qf[n][k][1]);
            }
        }
        float* my_red = red + warp * BT * RSTRIDE;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int p = mt * 16 + g8, h = n * 8 + 2 * t4;
                my_red[p * RSTRIDE + h] = sc[mt][n][0];
                my_red[p * RSTRIDE + h + 1] = sc[mt][n][1];
                my_red[(p + 8) * RSTRIDE + h] = sc[mt][n][2];
                my_red[(p + 8) * RSTRIDE + h + 1] = sc[mt][n][3];
            }
        __syncthreads();

        // Online softmax: warp w owns query rows RW w .. RW w + RW - 1, a lane one position (lanes past BT none).
        const bool valid = (BT == 32 || lane < BT) && t0 + lane < t_hi;
#pragma unroll
        for (int j = 0; j < RW; ++j) {
            const int h = warp * RW + j;
            float s = 0.f;
            if (BT == 32 || lane < BT)
#pragma unroll
                for (int v = 0; v < WARPS; ++v) s += red[(v * BT + lane) * RSTRIDE + h];
            s = valid ? s * LOG2E : -__int_as_float(0x7f800000);
            const float m_new = fmaxf(m_run[j], warp_max(s));
            const float alpha = ex2(m_run[j] - m_new);
            const float p = ex2(s - m_new);
            l_run[j] = l_run[j] * alpha + warp_sum(p);
            m_run[j] = m_new;
            if (BT == 32 || lane < BT) ps[h * PSTRIDE + lane] = to_f16(p);
            if (lane == 0) alpha_s[h] = alpha;
        }
        __syncthreads();

        // z^T += X_tile^T . P over this warp's rows of the width, rescaled first where a row's maximum rose
        // (after the first tiles it seldom does: most tiles skip the rescale).
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float a0 = alpha_s[n * 8 + 2 * t4], a1 = alpha_s[n * 8 + 2 * t4 + 1];
            if (a0 != 1.f || a1 != 1.f) {
#pragma unroll
                for (int ms = 0; ms < KS; ++ms) {
                    acc[ms][n][0] *= a0;
                    acc[ms][n][1] *= a1;
                    acc[ms][n][2] *= a0;
                    acc[ms][n][3] *= a1;
                }
            }
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
#pragma unroll
            for (int ms = 0; ms < KS; ++ms) {
                u32 a[4];
                ldm_x4_trans(tile + kk * 16 * (D * 2) + t_row + (((t_chunk + 2 * ms) ^ sw) << 4), a);
#pragma unroll
                for (int n = 0; n < NT; ++n) mma16816(acc[ms][n], a, pb[n][0], pb[n][1]);
            }
        }
        __syncthreads();  // the stage, the partial scores and P are rewritten next
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
#define INSTANCE(D, BT, NT, S)                                                                                      \
    template __global__ void absorbed_mma<D, BT, NT, S>(const f16*, const f16*, const int*, void*, float*, float*, \
                                                        int, int, int, int, int, int, int, int, int, int, int, int, \
                                                        int, int, int);
INSTANCE(1280, 32, 3, 2)
INSTANCE(1280, 16, 3, 5)
INSTANCE(384, 32, 3, 3)
INSTANCE(384, 32, 1, 3)
INSTANCE(1024, 32, 2, 3)
#endif
