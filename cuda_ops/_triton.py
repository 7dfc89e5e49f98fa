"""Triton availability for the kernels of cuda_ops.

Triton ships with PyTorch's CUDA wheels on x86-64 but is absent elsewhere (macOS, aarch64 CPU
installs); the kernel modules must still import there so that their PyTorch references work.
Without Triton, `jit` leaves a kernel a plain function and `tl.constexpr` resolves, so the kernel
definitions load but are never launched (`triton_usable` is False).

Whether a kernel runs on the CPU through Triton's interpreter is fixed when `@jit` runs, i.e. when
the kernel module is first imported: TRITON_INTERPRET=1 must be set before that.
"""

from __future__ import annotations

import contextlib
import os
import threading
from types import SimpleNamespace

import torch

try:
    import triton
    import triton.language as tl

    jit = triton.jit
    HAVE_TRITON = True
except ImportError:  # CPU-only install: kernels are defined but never launched
    triton = None
    tl = SimpleNamespace(constexpr=None)
    HAVE_TRITON = False

    def jit(fn=None, **_options):  # as triton.jit: @jit or @jit(do_not_specialize=...)
        return fn if fn is not None else (lambda f: f)


def interpreter_active() -> bool:
    """True when Triton kernels run on the CPU through its interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_usable(device: torch.device) -> bool:
    """Whether a Triton kernel can be launched on tensors of `device`."""
    if not HAVE_TRITON:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreter_active()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`; 132 (an H100/H200) for the CPU interpreter, so that
    launch shapes there are the ones the GPU gets."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


EAGER_OPS = os.environ.get("STREAMER_EAGER_OPS", "lean")
"""How ops outside CUDA graph capture (prefills) launch on CUDA: "lean" (the default: `eager_small`
tensors through PyTorch's ops, cuBLAS linears at bucketed row counts, `decode_linear.row_bucket`,
looked up before serving) or "kernels" (our Triton kernels, cuBLAS at the rows given). Measured in one
call on an H100 (session 22, docs/benchmarks.md): first token of live finals at new prompt lengths
p50 6.6 vs 9.3 ms (tiny.en) and 25.6 vs 36.7 ms (large-v3 shape); `accurate` uploads the same within
noise (354 / 361 / 430 vs 403 / 368 audio s/s); the CUDA tests pass with it."""
if EAGER_OPS not in ("kernels", "lean"):
    raise ValueError(f"STREAMER_EAGER_OPS must be kernels or lean, got {EAGER_OPS!r}")

EAGER_TORCH_MAX = 1 << 22
"""Elements up to which a LayerNorm or GELU outside CUDA graph capture runs PyTorch's kernels rather
than ours. Launching a Triton kernel costs the host 50-100 us, a PyTorch op 10-30 us
(benchmarks/probe_launch.py, H200, session 20); an eager prefill of a few windows is bound by those
launches, not by bytes (a quarter of `accurate`'s engine thread, py-spy), while in captured graphs
and on big tensors our fused kernels win. Same function: fp32 statistics, fp16 results."""


_graph_warmup = threading.local()


@contextlib.contextmanager
def as_in_graphs():
    """Ops inside run as they do under graph capture (our kernels, cuBLAS at the rows given): for the
    eager warm-up runs before a capture, so that what they compile and plan is what the capture
    launches (a Triton kernel first launched inside a capture would compile there)."""
    before = getattr(_graph_warmup, "on", False)
    _graph_warmup.on = True
    try:
        yield
    finally:
        _graph_warmup.on = before


def lean_eager() -> bool:
    """EAGER_OPS is "lean" and ops run eagerly: not under graph capture, nor a capture's warm-up."""
    return (EAGER_OPS == "lean" and not getattr(_graph_warmup, "on", False)
            and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()))


def eager_small(x: torch.Tensor) -> bool:
    """Whether `x` (on CUDA) is small and runs eagerly with EAGER_OPS "lean" (`lean_eager`): PyTorch's
    op is then the cheaper launch."""
    return x.numel() <= EAGER_TORCH_MAX and lean_eager()
