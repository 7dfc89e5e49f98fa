"""The linears of a decode step (a few rows) as a split-K GEMM with bias and GELU in its epilogue.

A captured large-v3 decode step at 128 rows runs six fp16 GEMMs a layer whose weights are 0.8-13 MB:
bound by reading them, 0.375 ms a step at copy bandwidth, but cuBLAS took 1.33 ms (H200, session 16,
`profile_step.py`): ~5.5-11 us a GEMM whatever its size. The idea here: split K too, so that
tiles x splits fills the SMs; each program multiplies its K-chunk, stores the fp32 partial tile,
and the last program of each output tile to finish (an atomic counter, as attention.py's one-pass
merge) sums the partials in split order (deterministic), adds the bias, applies GELU (fc1: the
exact erf formula of fp8.py's kernel, so the separate GELU launch goes too) and writes fp16.

**It does not pay, so it is off** (`benchmarks/sweep_decode_linear.py`, H200, session 16: graphs of
32 calls with 32 weights, best of 18-40 launches each): at large-v3's shapes cuBLAS was faster at
every row count from 1 to 256 (ours 0.70-0.99x) except attn_out-sized at 1 row (1.02x) and fc1 + GELU
at 1 and 8 rows (1.06-1.08x, the saved GELU launch); the engine at 128 / 256 windows ran the same
with or without those entries. Both sit at ~5 us a call for a 3 MB weight: per-kernel latency, not
bytes. Kept as an A/B for other GPUs and Tritons (correct on the H200: every decode linear through it,
full_fp16's tiny.en tokens equal the plain model's and 41 clips' transcripts equal cuBLAS's).

`linear` dispatches: F.linear (+ `bias_gelu`) unless STREAMER_DECODE_LINEAR asks for the kernel:
"rule" (every fp16 product of up to MAX_ROWS rows on CUDA, launched by `rule_launch`) or the path of
a JSON table as the sweep writes it (only the shapes and row counts it lists). `decode_linear_triton`
runs the kernel on any device (the CPU under TRITON_INTERPRET=1, for the tests).
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from cuda_ops import _triton
from cuda_ops._triton import interpreter_active, jit, num_sms, tl, triton, triton_usable
from cuda_ops.attention import _split_locks
from cuda_ops.fp8 import bias_gelu

MAX_ROWS = 256
"""Rows up to which `linear` may take the kernel (a decode step's; encoder GEMMs are cuBLAS's)."""

BUCKET_ROWS_MAX = 16384
"""Rows up to which an eager cuBLAS linear (outside graph capture: a prefill) runs at `row_bucket`'s
row count, with STREAMER_EAGER_OPS=lean (`_triton.EAGER_OPS`, the default). cuBLASLt looks up its kernel per new
problem shape, and that lookup costs the host ~260 us against ~20 us for a shape it has seen
(benchmarks/probe_launch.py, H200, session 20): a prefill's rows are windows x prompt length, nearly
always new, so a live final with a new prompt length pays it in each of the decoder's linears (6 a
layer). Padded to a few sizes an octave, the shapes repeat, and `warm_linears` looks them all up
before serving."""


def row_bucket(m: int) -> int:
    """m rounded up to one of eight sizes an octave (at most 12.5 % more; m itself up to 16)."""
    if m <= 16:
        return m
    step = 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def bucket_sizes(limit: int = BUCKET_ROWS_MAX) -> list[int]:
    """Every row count `row_bucket` gives up to `limit`."""
    sizes, m = [], 1
    while m <= limit:
        sizes.append(m)
        m = row_bucket(m + 1)
    return sizes


def _bucketed_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear(x, weight, bias) with x's rows padded to `row_bucket` (pad rows' outputs dropped)."""
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    padded = row_bucket(m)
    if padded == m or m > BUCKET_ROWS_MAX:
        return F.linear(x, weight, bias)
    buf = rows.new_empty(padded, rows.shape[1])
    buf[:m] = rows
    return F.linear(buf, weight, bias)[:m].view(*x.shape[:-1], weight.shape[0])


def warm_linears(linears: list, device: torch.device) -> None:
    """Run every bucketed row count once through each distinct (weight shape, bias) of the nn.Linear
    modules among `linears`, so that cuBLAS has looked up their kernels before the first prefill (with
    STREAMER_EAGER_OPS=lean, the default; nothing with "kernels")."""
    if _triton.EAGER_OPS != "lean":
        return
    seen = set()
    for lin in linears:
        if not isinstance(lin, torch.nn.Linear):  # an FP8 linear is not cuBLAS's F.linear
            continue
        key = (tuple(lin.weight.shape), lin.bias is not None, lin.weight.dtype)
        if key in seen:
            continue
        seen.add(key)
        x = torch.zeros(BUCKET_ROWS_MAX, lin.weight.shape[1], device=device, dtype=lin.weight.dtype)
        for m in bucket_sizes():
            F.linear(x[:m], lin.weight, lin.bias)


class GemmLaunch(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    split: int
    num_warps: int = 4
    stages: int = 3


def rule_launch(m: int, n: int, k: int, sms: int) -> GemmLaunch:
    """A launch from shapes alone: 64-column tiles, rows in one tile up to 64, and K split (in whole
    BLOCK_K steps) until tiles x splits reaches the SMs."""
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_n, block_k = 64, 64
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    steps = triton.cdiv(k, block_k)
    split = max(1, min(steps, triton.cdiv(sms, tiles), 16))
    return GemmLaunch(block_m, block_n, block_k, split)


def load_table(path: str) -> dict[tuple[int, int], list[tuple[int, GemmLaunch | None]]]:
    """A launch table from JSON {"N,K": [[max_rows, block_m, block_n, block_k, split, warps, stages]
    or [max_rows] (cuBLAS), ...]} (as `benchmarks/sweep_decode_linear.py` writes it): per weight
    shape, rows ascending."""
    with open(path) as f:
        raw = json.load(f)
    return {tuple(int(x) for x in key.split(",")): sorted(((r[0], GemmLaunch(*r[1:]) if len(r) > 1 else None)
                                                         for r in rows), key=lambda e: e[0])
            for key, rows in raw.items()}


MODE = os.environ.get("STREAMER_DECODE_LINEAR", "off")
""""off" (default): cuBLAS; "rule": the kernel everywhere up to MAX_ROWS rows; else a table's path."""
GELU_EPILOGUE = os.environ.get("STREAMER_GELU_EPILOGUE", "off")
"""An A/B only: "tanh" runs fc1 + GELU as one cuBLASLt GEMM with its GELU epilogue, which is the tanh
approximation (within ~5e-4 of the exact GELU Whisper was trained with, about half an fp16 step at
1.0): the separate GELU pass goes (0.069 s of a 3.3-s run of 256 large-v3 windows on the H200), but
the GEMMs slow by about as much (session 20: 2,265 against 2,274 rtf), so it stays off."""
LAUNCHES: dict[tuple[int, int], list[tuple[int, GemmLaunch | None]]] = {}
"""(N, K) -> [(max rows, launch or None for cuBLAS), ...]: the table MODE names."""
if MODE not in ("rule", "off"):
    LAUNCHES = load_table(MODE)


def choose_launch(m: int, n: int, k: int, sms: int) -> GemmLaunch | None:
    """The launch for an [m, k] x [k, n] product, or None where cuBLAS is the better (or only) choice."""
    if MODE == "off" or m > MAX_ROWS:
        return None
    if MODE == "rule":
        return rule_launch(m, n, k, sms)
    return next((launch for rows, launch in LAUNCHES.get((n, k), ()) if m <= rows), None)


def decode_linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None, gelu: bool = False) -> Tensor:
    """x @ weight.T + bias (then exact GELU) in fp32 math, returned in x's dtype."""
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return (F.gelu(y) if gelu else y).to(x.dtype)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, gelu: bool = False) -> Tensor:
    """F.linear(x, weight, bias) (then GELU, as `fp8.bias_gelu`) for x [..., K]: the split-K kernel for
    a decode step's rows on CUDA where `choose_launch` has a launch, else cuBLAS (with
    STREAMER_EAGER_OPS=lean, outside graph capture at a bucketed row count: `BUCKET_ROWS_MAX`)."""
    if MODE != "off" and x.is_cuda and x.dtype == weight.dtype == torch.float16 and triton_usable(x.device):
        rows = x.numel() // x.shape[-1]
        launch = choose_launch(rows, weight.shape[0], weight.shape[1], num_sms(x.device))
        if launch is not None:
            return decode_linear_triton(x, weight, bias, gelu, launch)
    if gelu and GELU_EPILOGUE == "tanh" and x.is_cuda and bias is not None:
        y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
        return y.view(*x.shape[:-1], weight.shape[0])
    y = _bucketed_linear(x, weight, bias) if x.is_cuda and _triton.lean_eager() else F.linear(x, weight, bias)
    return bias_gelu(y, None) if gelu else y


def decode_linear_triton(x: Tensor, weight: Tensor, bias: Tensor | None, gelu: bool = False,
                         launch: GemmLaunch | None = None, out: Tensor | None = None) -> Tensor:
    """The kernel on x's device -> [..., N] in x's dtype (`out`, if given, written in place)."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    N = weight.shape[0]
    if weight.shape[1] != K or weight.stride(1) != 1 or (bias is not None and bias.shape != (N,)):
        raise ValueError(f"need weight [N, {K}] contiguous along K and bias [N], got {tuple(weight.shape)}, "
                         f"{None if bias is None else tuple(bias.shape)}")
    launch = launch or rule_launch(M, N, K, num_sms(x.device))
    if launch.block_k & (launch.block_k - 1) or launch.block_m < 16 or launch.block_n < 16 or launch.split < 1:
        raise ValueError(f"bad launch {launch}")
    out2 = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out.view(M, N)
    steps = triton.cdiv(K, launch.block_k)
    chunk = triton.cdiv(steps, launch.split) * launch.block_k  # whole BLOCK_K steps per split
    split = triton.cdiv(K, chunk)
    grid_m, grid_n = triton.cdiv(M, launch.block_m), triton.cdiv(N, launch.block_n)
    tiles = grid_m * grid_n
    if split > 1:
        partials = torch.empty(tiles * split * launch.block_m * launch.block_n, dtype=torch.float32, device=x.device)
        locks = _split_locks(x.device, tiles)
    else:
        partials = locks = out2  # placeholders, never touched
    options = {} if interpreter_active() else {"num_stages": launch.stages}
    _decode_linear_kernel[(grid_n, split, grid_m)](
        x2, weight, out2 if bias is None else bias, out2, partials, locks, M, N, K, chunk,
        x2.stride(0), weight.stride(0), out2.stride(0), split,
        HAS_BIAS=bias is not None, GELU=gelu, SPLIT_K=split > 1, ON_GPU=x.is_cuda,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, BLOCK_K=launch.block_k,
        num_warps=launch.num_warps, **options,
    )  # fmt: skip
    return out2.view(*x.shape[:-1], N)


if triton is not None:
    from cuda_ops.fp8 import _gelu

    @jit
    def _epilogue(acc, b_ptr, out_ptr, rm, rn, M, N, stride_om,
                  HAS_BIAS: tl.constexpr, GELU: tl.constexpr, ON_GPU: tl.constexpr):
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if GELU:
            acc = _gelu(acc, ON_GPU)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)

    @jit
    def _decode_linear_kernel(
        x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, lock_ptr, M, N, K, chunk,
        stride_xm, stride_wn, stride_om, n_split,
        HAS_BIAS: tl.constexpr, GELU: tl.constexpr, SPLIT_K: tl.constexpr, ON_GPU: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
        w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k0 = pid_s * chunk
        for k in range(k0, tl.minimum(k0 + chunk, K), BLOCK_K):
            kk = k + rk[None, :]
            a = tl.load(x_rows + kk, mask=(rm[:, None] < M) & (kk < K), other=0.0)
            w = tl.load(w_rows + kk, mask=(rn[:, None] < N) & (kk < K), other=0.0)
            acc = tl.dot(a, tl.trans(w), acc)
        if not SPLIT_K:
            _epilogue(acc, b_ptr, out_ptr, rm, rn, M, N, stride_om, HAS_BIAS, GELU, ON_GPU)
        else:
            # Partials of a tile: n_split blocks of BLOCK_M x BLOCK_N floats, in split order. Every
            # thread's store comes before the counter's release (barrier, then the atomic); the
            # program that takes it to n_split - 1 acquires, reads the partials from L2 (.cg: no stale
            # L1 line from an earlier replay), sums them in split order and resets the counter.
            tile = pid_m * tl.num_programs(0) + pid_n
            cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            base = part_ptr + tile.to(tl.int64) * (n_split * BLOCK_M * BLOCK_N)
            tl.store(base + pid_s * (BLOCK_M * BLOCK_N) + cell, acc)
            tl.debug_barrier()
            count = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if count == n_split - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(n_split):
                    total += tl.load(base + s * (BLOCK_M * BLOCK_N) + cell, cache_modifier=".cg")
                _epilogue(total, b_ptr, out_ptr, rm, rn, M, N, stride_om, HAS_BIAS, GELU, ON_GPU)
                tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")
