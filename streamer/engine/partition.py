"""SM partitions of a CUDA GPU (green contexts, through the driver API): a stream whose kernels run
only on a given share of the SMs, and a CUDA graph captured on it keeps that share wherever it is
replayed (measured on the H200 in session 12, benchmarks/probe_green.py).

Why (issue 15): a decode step is bound by reading the cross K/V, and cuDNN's single-query attention
reads at 95 % of the GPU's bandwidth on 64 of the H200's 132 SMs (probe_sm_bandwidth.py, session 18),
while an encoder pass is bound by the tensor cores, close to in proportion to its SMs. A step on part
of the SMs beside an encoder pass on the rest took 0.85x the time of the two one after the other
(probe_green.py --split, session 18); on the same SMs they stretch each other (0.95x).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

CU_DEV_RESOURCE_TYPE_SM = 1
CU_GREEN_CTX_DEFAULT_STREAM = 0x1  # required by cuGreenCtxCreate
CU_STREAM_NON_BLOCKING = 0x1
_RESOURCE_BYTES = 1024
"""Room for one CUdevResource (about 144 bytes in the CUDA 12.4-13.x headers): the driver writes
it, we only read `sm.smCount` and pass it back."""
_SM_COUNT_OFFSET = 96
"""CUdevResource: `type` (4 bytes) and `_internal_padding[92]`, then the union whose first member
is CUdevSmResource, whose first field is `smCount`."""


@dataclass
class GreenStream:
    """A stream on `sms` SMs of `device` (`stream` is usable as any torch stream)."""

    stream: torch.cuda.ExternalStream
    sms: int
    device: torch.device
    _context: ctypes.c_void_p  # CUgreenCtx, kept for the process's life (see `green_stream`)


_made: dict[tuple[int, int, int], tuple[GreenStream, GreenStream]] = {}


def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        message = ctypes.c_char_p()
        lib.cuGetErrorString(result, ctypes.byref(message))
        raise RuntimeError(f"{what} failed: CUDA driver error {result} ({(message.value or b'?').decode()})")


def green_stream(num_sms: int, device: torch.device | str | int = "cuda", priority: int = 0) -> GreenStream:
    """A stream in a green context of at least `num_sms` SMs of `device` (the driver rounds up to
    its partition granularity: 8 SMs on Hopper). Made once per (device, SMs, priority) in a process
    and then shared: engines made one after another in one process (tests, benchmarks) reuse it."""
    return green_pair(num_sms, device, priority)[0]


def green_pair(num_sms: int, device: torch.device | str | int = "cuda", priority: int = 0) -> tuple[GreenStream, GreenStream]:
    """Streams in two green contexts that split `device`'s SMs: at least `num_sms` (rounded up as
    green_stream's) and the rest. Two green_stream calls would overlap: each takes the first SMs."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"SM partitions need a CUDA device, not {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).multi_processor_count
    if not 0 < num_sms < total:
        raise ValueError(f"an SM partition takes between 1 and {total - 1} of the {total} SMs, not {num_sms}")
    key = (index, num_sms, priority)
    if key in _made:
        return _made[key]
    torch.cuda.init()
    torch.cuda.synchronize(index)  # the primary context exists and is current (cuInit done)
    lib = _driver()
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
    whole = ctypes.create_string_buffer(_RESOURCE_BYTES)
    part = ctypes.create_string_buffer(_RESOURCE_BYTES)
    rest = ctypes.create_string_buffer(_RESOURCE_BYTES)
    _check(lib, lib.cuDeviceGetDevResource(dev, whole, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    groups = ctypes.c_uint(1)
    _check(lib, lib.cuDevSmResourceSplitByCount(part, ctypes.byref(groups), whole, rest, 0, num_sms),
           "cuDevSmResourceSplitByCount")

    def stream_on(resource) -> GreenStream:
        sms = ctypes.c_uint.from_buffer(resource, _SM_COUNT_OFFSET).value
        desc = ctypes.c_void_p()
        _check(lib, lib.cuDevResourceGenerateDesc(ctypes.byref(desc), resource, 1), "cuDevResourceGenerateDesc")
        context = ctypes.c_void_p()
        _check(lib, lib.cuGreenCtxCreate(ctypes.byref(context), desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate")
        handle = ctypes.c_void_p()
        _check(lib, lib.cuGreenCtxStreamCreate(ctypes.byref(handle), context, CU_STREAM_NON_BLOCKING, priority),
               "cuGreenCtxStreamCreate")
        return GreenStream(torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", index)), sms,
                           torch.device("cuda", index), context)

    made = (stream_on(part), stream_on(rest))
    _made[key] = made
    return made
