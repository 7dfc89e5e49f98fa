"""The absorbed cross-attention z = softmax(qa X^T) X on tensor cores: the CUDA C++ kernel in
csrc/cross_absorbed_mma.cu, compiled at first use with NVRTC (which PyTorch's CUDA wheels carry; no
build step, no nvcc) and launched on the current stream, so CUDA graphs capture it.

Why a hand-written kernel: the Triton kernel (cross_absorbed.py) made the query rows the products' M
(16 or 32) and held a [rows, D] accumulator beside a [positions, D] block of X in registers; at D =
1280 it reached ~1.6 TB/s and ~64 TFLOP/s on an H100 (session 22), below cuDNN over twice the bytes.
This one makes positions and the width the M of mma.sync (the queries N, padded to 8), stages tiles
of X (32 or 16 positions x D) in shared memory one or more tiles ahead (cp.async) and feeds both products
from there, so X is read from memory once and the tensor cores wait on nothing else (the design: the
.cu file's header).

Where it does not apply (not CUDA, not fp16, widths that are not a multiple of 128 up to 1280, more
shared memory than the device gives a block, NVRTC missing) `usable` is False and cross_absorbed.py
runs the Triton kernel.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

SOURCE = Path(__file__).parent / "csrc" / "cross_absorbed_mma.cu"
WARPS, NMAX, PSTRIDE, RSTRIDE, MERGE_MAX = 8, 24, 40, 26, 64  # as the .cu file defines them
SPLIT_BT = 32  # positions per tile that choose_splits counts in (a span is at least two such tiles)
ENABLED = os.environ.get("STREAMER_ABSORBED_KERNEL", "mma") == "mma"
"""STREAMER_ABSORBED_KERNEL=triton runs the Triton kernel instead (A/B runs)."""
TILE_OVERRIDE = os.environ.get("STREAMER_ABSORBED_TILE", "")
"""STREAMER_ABSORBED_TILE=16x5 (positions a tile x stages) replaces `choose_tile`'s choice where it fits
(sweeps on a GPU: benchmarks/probe_absorbed.py --tiles)."""


class Tile(NamedTuple):
    """A block's shape: positions a tile of X (16 or 32) and tiles staged in shared memory (STAGES - 1 in
    flight while one is worked on)."""
    bt: int
    stages: int


def shared_bytes(d: int, tile: Tile) -> int:
    """Dynamic shared memory of a block: the X stages, the partial scores, P, alpha and l."""
    return tile.stages * tile.bt * d * 2 + WARPS * tile.bt * RSTRIDE * 4 + NMAX * PSTRIDE * 2 + 2 * NMAX * 4


def fits(d: int, tile: Tile, limit: int) -> bool:
    """Whether `tile` runs at width `d` in `limit` bytes of shared memory."""
    return shared_bytes(d, tile) <= limit


@functools.cache
def _device_facts(index: int) -> tuple[int, int, tuple[int, int]]:
    """(shared memory a block may opt into, multiprocessors, compute capability) of CUDA device `index`."""
    props = torch.cuda.get_device_properties(index)
    return getattr(props, "shared_memory_per_block_optin", 48 * 1024), props.multi_processor_count, (props.major, props.minor)


def parse_tile(text: str) -> Tile:
    """'16x5' -> Tile(16, 5): positions (16 or 32) x stages (2 to 8)."""
    try:
        tile = Tile(*(int(v) for v in text.lower().split("x")))
    except (ValueError, TypeError):
        raise ValueError(f"a tile is BTxSTAGES such as 16x5, got {text!r}") from None
    if tile.bt not in (16, 32) or not 2 <= tile.stages <= 8:
        raise ValueError(f"a tile is 16 or 32 positions x 2 to 8 stages, got {text!r}")
    return tile


def choose_tile(d: int, limit: int) -> Tile | None:
    """The block's shape at width `d` with `limit` bytes of shared memory (None: none fits): three
    32-position stages (two tiles in flight) where they fit, else two. Session 31 (H100, D 1280, 128-256
    rows): 16-position tiles with 2-5 stages ran at ~1.9 TB/s against 2.5 TB/s for 32x2, the same with
    four tiles in flight as with one (16 warps a block and three barriers a tile did not help either):
    the block's own instructions bound it, not memory latency (ncu: 2 warps a scheduler, 0.6 eligible)."""
    if TILE_OVERRIDE and fits(d, parse_tile(TILE_OVERRIDE), limit):
        return parse_tile(TILE_OVERRIDE)
    return next((t for t in (Tile(32, 3), Tile(32, 2)) if fits(d, t, limit)), None)


def supported(device: torch.device, dtype: torch.dtype, d: int) -> bool:
    """Whether this kernel runs queries and encoder states of `dtype` and width `d` on `device`
    (compiling it there on first use)."""
    if not (ENABLED and device.type == "cuda" and dtype == torch.float16):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    limit, _, capability = _device_facts(index)
    tile = choose_tile(d, limit)
    if d % 128 or d > 1280 or capability < (8, 0) or tile is None:
        return False
    return _kernel(index, d, 3, tile) is not None and _merge_kernel(index) is not None


def usable(qa: Tensor, x: Tensor) -> bool:
    """Whether this kernel takes these inputs on their device."""
    return x.dtype == qa.dtype and supported(qa.device, qa.dtype, qa.shape[-1])


@functools.cache
def _load(index: int, name: str, shared: int = 0):
    """Kernel `name` (a name expression of the .cu file) compiled with NVRTC and loaded on CUDA device
    `index` (a module per device), its dynamic shared memory limit raised to `shared` bytes; None (once,
    with a warning) where NVRTC or PyTorch's loader is missing. Compiled at first use, by `supported`: the
    engine's warm-up calls reach it before any graph capture."""
    try:
        from torch.cuda._utils import _cuda_load_module, _nvrtc_compile

        with torch.cuda.device(index):
            cubin, mangled = _nvrtc_compile(SOURCE.read_text(), name, nvcc_options=["-std=c++17"])
            kernel = _cuda_load_module(cubin, [mangled])[mangled]
            if shared:
                kernel.set_shared_memory_config(shared)
        return kernel
    except Exception as e:  # noqa: BLE001 - any failure to build means the Triton kernel runs instead
        import warnings

        warnings.warn(f"absorbed mma kernel {name} unavailable ({type(e).__name__}: {e}); using the Triton kernel", stacklevel=2)
        return None


def _kernel(index: int, d: int, nt: int, tile: Tile):
    """The instance <d, bt, nt, stages> on CUDA device `index` (see `_load`)."""
    return _load(index, f"absorbed_mma<{d}, {tile.bt}, {nt}, {tile.stages}>", shared_bytes(d, tile))


def _merge_kernel(index: int):
    """`absorbed_merge` (the spans' partial sums merged, one pass) on CUDA device `index` (see `_load`)."""
    return _load(index, "absorbed_merge")


def choose_splits(rows: int, groups: int, T: int, sms: int) -> int:
    """Spans of positions per row so that rows x groups x spans fills one wave of `sms` (a block an
    SM), each span at least 2 tiles long (the pipeline's depth). H100, 8 rows x 20 heads at D 1280
    (results/s23_h100/b): a block's time is nearly proportional to its tiles, 0.20 ms at 1 span a row,
    0.035 ms at 8; the merge kernel costs a few microseconds."""
    return max(1, min(sms // max(1, rows * groups), T // (2 * SPLIT_BT)))


def absorbed_attention_mma(qa: Tensor, x: Tensor, windows: Tensor | None = None, splits: int = 0,
                           out_dtype: torch.dtype | None = None, tile: Tile | None = None) -> Tensor:
    """z [B, Hq, D] = softmax(qa X_w^T) X_w for fp16 queries qa [B, Hq, D] and encoder states
    x [W, T, D] on CUDA (`usable`); row b reads window windows[b] (int32 [B]; None: window b).
    splits: spans of positions per row (0: as many as fill the GPU); tile: the block's shape (None:
    `choose_tile`'s)."""
    B, Hq, D = qa.shape
    W, T, Dx = x.shape
    if Dx != D:
        raise ValueError(f"qa [B, Hq, D] and x [W, T, D] disagree: {tuple(qa.shape)}, {tuple(x.shape)}")
    if windows is None and W < B:
        raise ValueError(f"{B} rows over {W} windows need a windows index")
    if windows is not None and (windows.shape != (B,) or windows.dtype != torch.int32):
        raise ValueError(f"windows must be int32 [{B}], got {windows.dtype} {tuple(windows.shape)}")
    # 32-bit query loads and 16-byte copies of X: rows aligned so
    if qa.stride(2) != 1 or qa.stride(0) % 2 or qa.stride(1) % 2 or qa.data_ptr() % 4:
        qa = qa.contiguous()
    if x.stride(2) != 1 or x.stride(0) % 8 or x.stride(1) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    groups = -(-Hq // NMAX)
    hg = -(-Hq // groups)  # query rows a block, spread evenly over the groups
    nt = -(-hg // 8)
    index = qa.device.index if qa.device.index is not None else torch.cuda.current_device()
    limit, sms, _ = _device_facts(index)
    tile = Tile(*tile) if tile else choose_tile(D, limit)
    if tile is None or not fits(D, tile, limit):
        raise ValueError(f"tile {tile} does not fit width {D} and {limit} bytes of shared memory")
    kernel = _kernel(index, D, nt, tile)
    if kernel is None:
        raise RuntimeError(f"absorbed_mma<{D}, {tile}> did not compile (see the warning)")
    bt = tile.bt
    splits = splits or choose_splits(B, groups, T, sms)
    span = -(-T // splits)
    span = -(-span // bt) * bt
    splits = -(-T // span)
    if splits > MERGE_MAX:
        raise ValueError(f"at most {MERGE_MAX} spans a row, got {splits}")
    out_dtype = out_dtype or qa.dtype
    one = splits == 1
    if one:
        out = torch.empty(B, Hq, D, device=qa.device, dtype=torch.float16)
        m = l = torch.empty(1, device=qa.device, dtype=torch.float32)  # unused
        s_ob, s_os, s_oh = out.stride(0), 0, out.stride(1)
    else:
        out = torch.empty(B, splits, Hq, D, device=qa.device, dtype=torch.float32)
        m = torch.empty(B, splits, Hq, device=qa.device, dtype=torch.float32)
        l = torch.empty_like(m)
        s_ob, s_os, s_oh = out.stride(0), out.stride(1), out.stride(2)
    win = windows if windows is not None else m  # any pointer: unread without windows
    kernel(grid=(B * groups, splits, 1), block=(WARPS * 32, 1, 1), shared_mem=shared_bytes(D, tile),
           args=[qa, x, win, out, m, l, T, span, Hq, hg, groups, qa.stride(0), qa.stride(1), x.stride(0), x.stride(1),
                 s_ob, s_os, s_oh, splits * Hq, int(windows is not None), int(one)])
    if one:
        return out if out_dtype == torch.float16 else out.to(out_dtype)
    z = torch.empty(B, Hq, D, device=qa.device, dtype=torch.float16)
    _merge_kernel(index)(grid=(B * Hq, 1, 1), block=(min(256, D // 4), 1, 1), args=[out, m, l, z, Hq, D, splits])
    return z if out_dtype == torch.float16 else z.to(out_dtype)
