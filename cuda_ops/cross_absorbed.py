"""Cross-attention over the encoder output itself: the K and V projections folded into the query and
the output, so that a decode step reads each window's 1500 x D encoder states once per layer instead
of its K and V (half the bytes), and the cache holds them once for all layers, not K and V per layer
(large-v3: 3.8 MB a window instead of 245 MB).

For head h with K = X W_k^T (Whisper's key projection has no bias) and V = X W_v^T + b_v:
    softmax(q_h K_h^T / sqrt(Dh)) V_h = softmax(qa_h X^T) X W_v,h^T + b_v,h,  qa_h = q_h W_k,h / sqrt(Dh)
where W_k,h, W_v,h are the head's Dh rows of the projections ([Dh, D]) and the softmax weights sum
to one, so b_v passes through. The attention is then H queries of width D over keys = values = X:
`absorb_query` makes qa [B, H, D], `absorbed_attention` computes z = softmax(qa X^T) X [B, H, D],
`absorbed_output` applies W_v,h and b_v. The attention does D / Dh (20 for large-v3) times the
multiply-adds of the head-split form over half the bytes; at a decode step's one query per head
it stays bound by bytes on an H100/H200 (~100 flop a byte against a ridge of ~200), which is what
benchmarks/probe_absorbed.py measures against cuDNN's attention over the K/V cache.

`absorbed_attention` runs the tensor-core kernel of cross_absorbed_mma.py (CUDA C++, a decode step's
up to 48 query rows a window), two cuBLAS GEMMs for more rows (a prompt's prefill), else the Triton
kernel on CUDA (or on the CPU under TRITON_INTERPRET=1, for the
tests) and the reference elsewhere. One program takes a row, a group of HG query rows and a span of
positions; it holds the group's queries and its [HG, D] accumulator in registers and loads each
block of X once for both of its products (scores, then the weighted sum). D is split into two
power-of-two parts (1280 = 1024 + 256), since Triton's blocks are powers of two.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import Tensor

from cuda_ops import cross_absorbed_mma
from cuda_ops._triton import jit, num_sms, tl, triton_usable

LOG2E = 1.4426950408889634


class AbsorbedLaunch(NamedTuple):
    """A launch of the kernel: query rows per program, positions per block, spans per row (0: as many as
    fill the GPU, `choose_splits`), warps and pipeline stages."""

    group: int = 16
    block_t: int = 32
    splits: int = 0
    num_warps: int = 8
    num_stages: int = 2
    transposed: bool = False
    """Positions and the width as the products' M (scores^T = X q^T, z^T = X^T p^T), so that Hopper's
    warpgroup MMA (M a multiple of 64) can run them; else the query rows are M (16 or 32). At width
    1280 it does not fit (OutOfResources on the H100, session 22)."""
    reload_q: bool = False
    """Load the group's queries from global memory (L1) at every block instead of holding them in
    registers beside the [HG, D] accumulator (at HG 32 and 8 warps the two need ~240 registers a thread)."""
    prefetch: bool = False
    """Issue the loads of the next block of X before the products of this one, in registers (X feeds two
    products, one transposed: if Triton's pipeliner does not stage such a load through shared memory,
    every block waits a full memory latency; at ~1.6 TB/s that is what session 22 saw)."""


def parse_launch(text: str) -> AbsorbedLaunch:
    """"group/block_t/splits/num_warps/num_stages[/transposed[/reload_q[/prefetch]]]" (as the probe prints it;
    booleans as 0/1 or False/True) -> AbsorbedLaunch."""
    parts = text.split("/")
    if not 5 <= len(parts) <= 8:
        raise ValueError(f"an absorbed launch is g/bt/splits/warps/stages[/transposed[/reload_q[/prefetch]]], got {text!r}")
    ints = [int(p) for p in parts[:5]]
    flags = [p in ("1", "True") for p in parts[5:]]
    return AbsorbedLaunch(*ints, *flags)


DEFAULT_LAUNCH = parse_launch(os.environ.get("STREAMER_ABSORBED_LAUNCH", "16/64/1/8/2"))
"""The engine's launch: the fastest at 256 and 32 rows of session 22's sweep on an H100 (within 5 % of the
best at 128; one span a row: the spans' merge cost more than the parallelism gained, even at 32 rows);
STREAMER_ABSORBED_LAUNCH sets another (A/B runs: session 22's gpu_s22.sh, benchmarks/README.md)."""


def width_parts(d: int) -> tuple[int, int]:
    """(DA, DB) with DA the largest power of two <= d and DB = d - DA a power of two or 0; ValueError
    for widths that do not split so (every Whisper width does: 384, 512, 768, 1024, 1280)."""
    da = 1 << (d.bit_length() - 1)
    db = d - da
    if da < 16 or (db and (db < 16 or db & (db - 1))):
        raise ValueError(f"the width {d} is not a power of two (>= 16) or the sum of two")
    return da, db


def absorb_query(q: Tensor, w_k: Tensor) -> Tensor:
    """qa [B, H, D] = q_h W_k,h / sqrt(Dh) of queries q [B, H, Dh] and the key projection's weight
    w_k [H * Dh, D] (rows of head h: h * Dh ... (h + 1) * Dh). Computed in q's dtype, fp32 accumulation."""
    B, H, Dh = q.shape
    wk = w_k.view(H, Dh, w_k.shape[1])
    out = torch.empty(H, B, w_k.shape[1], device=q.device, dtype=q.dtype)
    # the scale as the GEMM's alpha: no elementwise pass of its own (a kernel a layer in the step)
    return torch.baddbmm(out, q.transpose(0, 1), wk, beta=0, alpha=Dh**-0.5).transpose(0, 1)  # [B, H, D] view


def absorbed_output(z: Tensor, w_v: Tensor, b_v: Tensor | None) -> Tensor:
    """a [B, H, Dh] = z_h W_v,h^T + b_v,h of z [B, H, D] (the attention over X) and the value projection's
    weight [H * Dh, D] and bias [H * Dh]."""
    B, H, D = z.shape
    wv = w_v.view(H, -1, D)
    if b_v is None:
        return torch.bmm(z.transpose(0, 1), wv.transpose(1, 2)).transpose(0, 1)  # [B, H, Dh]
    # the bias as the GEMM's input (beta 1): no elementwise pass of its own (a kernel a layer in the step)
    return torch.baddbmm(b_v.view(H, 1, -1).expand(H, B, -1), z.transpose(0, 1), wv.transpose(1, 2)).transpose(0, 1)


def absorbed_attention_reference(qa: Tensor, x: Tensor, windows: Tensor | None = None) -> Tensor:
    """z [B, Hq, D] = softmax(qa X_w^T) X_w in float32, for queries qa [B, Hq, D] and encoder states
    x [W, T, D]; row b reads window windows[b] (None: window b)."""
    xs = (x if windows is None else x[windows.long()]).float()
    return (qa.float() @ xs.transpose(1, 2)).softmax(-1) @ xs


GEMM_ROWS = 2 * cross_absorbed_mma.NMAX
"""Query rows a window above which `absorbed_attention` runs two batched GEMMs on CUDA (a prompt's
prefill: tokens x heads rows): the kernels read X once per group of rows (24 for the mma kernel),
the GEMMs twice whatever the rows."""


def absorbed_attention_gemm(qa: Tensor, x: Tensor, windows: Tensor | None = None) -> Tensor:
    """`absorbed_attention_reference` in qa's dtype with cuBLAS: the logits in float32 (bmm's out_dtype),
    the softmax in float32, its weights rounded to qa's dtype for the second product (as the kernels do)."""
    xs = x if windows is None else x.index_select(0, windows)
    logits = torch.bmm(qa, xs.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(logits.softmax(-1).to(qa.dtype), xs)


def choose_splits(rows: int, groups: int, T: int, sms: int, block_t: int) -> int:
    """Spans of positions per row so that rows x groups x spans fills ~2 waves of `sms` (one program an
    SM: its accumulator takes most of the registers), each span at least 4 blocks long."""
    want = max(1, -(-2 * sms // (rows * groups)))
    return max(1, min(want, T // (4 * block_t)))


def absorbed_attention(qa: Tensor, x: Tensor, windows: Tensor | None = None,
                       launch: AbsorbedLaunch | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """`absorbed_attention_reference` in `out_dtype` (default qa's dtype). Unless a Triton `launch` is
    asked for: on CUDA with more than GEMM_ROWS query rows through `absorbed_attention_gemm`, else
    through the tensor-core kernel (cross_absorbed_mma.py) where it applies; else through the Triton
    kernel where Triton can run (`launch`, default DEFAULT_LAUNCH), else the reference (cast)."""
    out_dtype = out_dtype or qa.dtype
    if launch is None and qa.is_cuda and qa.shape[1] > GEMM_ROWS and qa.dtype in (torch.float16, torch.bfloat16):
        return absorbed_attention_gemm(qa, x, windows).to(out_dtype)
    if launch is None and cross_absorbed_mma.usable(qa, x):
        return cross_absorbed_mma.absorbed_attention_mma(qa, x, windows, out_dtype=out_dtype)
    if not triton_usable(qa.device):
        return absorbed_attention_reference(qa, x, windows).to(out_dtype)
    return absorbed_attention_triton(qa, x, windows, launch or DEFAULT_LAUNCH, out_dtype)


def absorbed_attention_triton(qa: Tensor, x: Tensor, windows: Tensor | None = None,
                              launch: AbsorbedLaunch = DEFAULT_LAUNCH, out_dtype: torch.dtype | None = None) -> Tensor:
    B, Hq, D = qa.shape
    W, T, Dx = x.shape
    if Dx != D:
        raise ValueError(f"qa [B, Hq, D] and x [W, T, D] disagree: {tuple(qa.shape)}, {tuple(x.shape)}")
    if qa.stride(2) != 1 or x.stride(2) != 1:
        raise ValueError("qa and x must be contiguous along their last dimension")
    if windows is None and W < B:
        raise ValueError(f"{B} rows over {W} windows need a windows index")
    if windows is not None and (windows.shape != (B,) or windows.dtype != torch.int32):
        raise ValueError(f"windows must be int32 [{B}], got {windows.dtype} {tuple(windows.shape)}")
    if launch.transposed and (launch.reload_q or launch.prefetch):
        raise ValueError("reload_q and prefetch are for the untransposed launch")
    da, db = width_parts(D)
    hg, bt = launch.group, launch.block_t
    groups = -(-Hq // hg)
    splits = launch.splits or choose_splits(B, groups, T, num_sms(qa.device), bt)
    span = -(-T // splits)
    span = -(-span // bt) * bt
    splits = -(-T // span)
    out_dtype = out_dtype or qa.dtype
    one = splits == 1
    if one:
        out = torch.empty(B, 1, Hq, D, device=qa.device, dtype=out_dtype)
        m = l = out  # unused
    else:
        out = torch.empty(B, splits, Hq, D, device=qa.device, dtype=torch.float32)
        m = torch.empty(B, splits, Hq, device=qa.device, dtype=torch.float32)
        l = torch.empty_like(m)
    win = windows if windows is not None else qa  # any pointer: unread without HAS_WINDOWS
    _absorbed_kernel[(B * groups, splits)](
        qa, x, win, out, m, l, T, span,
        qa.stride(0), qa.stride(1), x.stride(0), x.stride(1),
        out.stride(0), out.stride(1), out.stride(2), Hq * splits if not one else 0,
        HQ=Hq, GROUPS=groups, HG=hg, BT=bt, DA=da, DB=db,
        HAS_WINDOWS=windows is not None, NORMALIZE=one, TRANS=launch.transposed, RELOAD=launch.reload_q,
        PREFETCH=launch.prefetch,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    if one:
        return out[:, 0]
    # Merge the spans: each span's sum rescaled to the common maximum.
    top = m.amax(1, keepdim=True)
    w = torch.exp(m - top)  # [B, S, Hq]
    z = (out * w[..., None]).sum(1) / (l * w).sum(1)[..., None]
    return z.to(out_dtype)


@jit
def _load_x(x_row, offs_t, tmask, da, db, s_xt, DB: tl.constexpr):
    """The block's two parts of X, [BT, DA] and [BT, DB] (xa twice when DB is 0)."""
    xa = tl.load(x_row + offs_t[:, None] * s_xt + da[None, :], mask=tmask[:, None], other=0.0)
    xb = xa
    if DB > 0:
        xb = tl.load(x_row + offs_t[:, None] * s_xt + db[None, :], mask=tmask[:, None], other=0.0)
    return xa, xb


@jit
def _load_q(q_row, hmask, da, db, DB: tl.constexpr):
    """The group's queries, [HG, DA] and [HG, DB] (q_a twice when DB is 0)."""
    q_a = tl.load(q_row + da[None, :], mask=hmask[:, None], other=0.0)
    q_b = q_a
    if DB > 0:
        q_b = tl.load(q_row + db[None, :], mask=hmask[:, None], other=0.0)
    return q_a, q_b


@jit
def _scores(q_a, q_b, xa, xb, DB: tl.constexpr):
    """[HG, BT] qa . x over the block's positions."""
    s = tl.dot(q_a, tl.trans(xa))
    if DB > 0:
        s += tl.dot(q_b, tl.trans(xb))
    return s


@jit
def _absorbed_kernel(
    qa_ptr, x_ptr, win_ptr, o_ptr, m_ptr, l_ptr, T, span,
    s_qb, s_qh, s_xw, s_xt, s_ob, s_os, s_oh, s_mb,
    HQ: tl.constexpr, GROUPS: tl.constexpr, HG: tl.constexpr, BT: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr,
    HAS_WINDOWS: tl.constexpr, NORMALIZE: tl.constexpr, TRANS: tl.constexpr, RELOAD: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)  # row * GROUPS + group: a row's groups run side by side and share X in L2
    split = tl.program_id(1)
    b = pid // GROUPS
    g = pid % GROUPS
    w = b
    if HAS_WINDOWS:
        w = tl.load(win_ptr + b)
    heads = g * HG + tl.arange(0, HG)
    hmask = heads < HQ
    da = tl.arange(0, DA)
    db = DA + tl.arange(0, DB if DB > 0 else 16)
    q_row = qa_ptr + b.to(tl.int64) * s_qb + heads[:, None] * s_qh
    x_row = x_ptr + w.to(tl.int64) * s_xw
    t_lo = split * span
    t_hi = tl.minimum(T, t_lo + span)
    m_i = tl.full([HG], float("-inf"), tl.float32)
    l_i = tl.zeros([HG], tl.float32)
    if TRANS:
        acc_a, acc_b, m_i, l_i = _span_t(q_row, hmask, x_row, t_lo, t_hi, da, db, s_xt, m_i, l_i, HG, BT, DA, DB)
    else:
        acc_a, acc_b, m_i, l_i = _span(q_row, hmask, x_row, t_lo, t_hi, da, db, s_xt, m_i, l_i, HG, BT, DA, DB,
                                         RELOAD, PREFETCH)
    o_row = o_ptr + b.to(tl.int64) * s_ob + split * s_os + heads[:, None] * s_oh
    if NORMALIZE:
        inv = 1.0 / l_i
        tl.store(o_row + da[None, :], (acc_a * inv[:, None]).to(o_ptr.dtype.element_ty), mask=hmask[:, None])
        if DB > 0:
            tl.store(o_row + db[None, :], (acc_b * inv[:, None]).to(o_ptr.dtype.element_ty), mask=hmask[:, None])
    else:
        tl.store(o_row + da[None, :], acc_a, mask=hmask[:, None])
        if DB > 0:
            tl.store(o_row + db[None, :], acc_b, mask=hmask[:, None])
        ml = b.to(tl.int64) * s_mb + split * HQ + heads
        tl.store(m_ptr + ml, m_i / 1.4426950408889634, mask=hmask)  # back to natural units
        tl.store(l_ptr + ml, l_i, mask=hmask)


@jit
def _span(q_row, hmask, x_row, t_lo, t_hi, da, db, s_xt, m_i, l_i,
          HG: tl.constexpr, BT: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, RELOAD: tl.constexpr,
          PREFETCH: tl.constexpr):
    """Online softmax over positions [t_lo, t_hi), query rows as M: (acc_a, acc_b [HG, DA/DB], m, l).
    RELOAD: the queries are loaded at every block, not held. PREFETCH: the next block's X is loaded
    before this block's products."""
    if not RELOAD:
        q_a, q_b = _load_q(q_row, hmask, da, db, DB)
    acc_a = tl.zeros([HG, DA], tl.float32)
    acc_b = tl.zeros([HG, DB if DB > 0 else 16], tl.float32)
    if PREFETCH:
        first = t_lo + tl.arange(0, BT)
        xa_next, xb_next = _load_x(x_row, first, first < t_hi, da, db, s_xt, DB)
    for t0 in range(t_lo, t_hi, BT):
        offs_t = t0 + tl.arange(0, BT)
        tmask = offs_t < t_hi
        if PREFETCH:
            xa, xb = xa_next, xb_next
            ahead = offs_t + BT
            xa_next, xb_next = _load_x(x_row, ahead, ahead < t_hi, da, db, s_xt, DB)
        else:
            xa, xb = _load_x(x_row, offs_t, tmask, da, db, s_xt, DB)
        if RELOAD:
            q_a, q_b = _load_q(q_row, hmask, da, db, DB)
        s = _scores(q_a, q_b, xa, xb, DB)
        s = tl.where(tmask[None, :], s * 1.4426950408889634, float("-inf"))  # log2 units for exp2
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p16 = p.to(xa.dtype)
        acc_a = acc_a * alpha[:, None] + tl.dot(p16, xa)
        if DB > 0:
            acc_b = acc_b * alpha[:, None] + tl.dot(p16, xb)
        m_i = m_new
    return acc_a, acc_b, m_i, l_i


@jit
def _span_t(q_row, hmask, x_row, t_lo, t_hi, da, db, s_xt, m_i, l_i,
            HG: tl.constexpr, BT: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr):
    """`_span` with positions and the width as M (scores^T [BT, HG], z^T [DA, HG]); returns z untransposed."""
    q_a, q_b = _load_q(q_row, hmask, da, db, DB)
    q_at = tl.trans(q_a)
    q_bt = tl.trans(q_b)
    acc_a = tl.zeros([DA, HG], tl.float32)
    acc_b = tl.zeros([DB if DB > 0 else 16, HG], tl.float32)
    for t0 in range(t_lo, t_hi, BT):
        offs_t = t0 + tl.arange(0, BT)
        tmask = offs_t < t_hi
        xa, xb = _load_x(x_row, offs_t, tmask, da, db, s_xt, DB)
        s = tl.dot(xa, q_at)
        if DB > 0:
            s += tl.dot(xb, q_bt)
        s = tl.where(tmask[:, None], s * 1.4426950408889634, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        p16 = p.to(xa.dtype)
        acc_a = acc_a * alpha[None, :] + tl.dot(tl.trans(xa), p16)
        if DB > 0:
            acc_b = acc_b * alpha[None, :] + tl.dot(tl.trans(xb), p16)
        m_i = m_new
    return tl.trans(acc_a), tl.trans(acc_b), m_i, l_i


def absorbed_flops(rows: int, hq: int, T: int, D: int) -> int:
    """Multiply-adds x 2 of the attention (scores and weighted sum) for `rows` rows of `hq` queries."""
    return 4 * rows * hq * T * D

