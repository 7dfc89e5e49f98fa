"""Kernel tests run on CUDA when present, else through Triton's interpreter on the CPU.

Triton decides interpret-or-compile when a kernel's `@triton.jit` runs, so TRITON_INTERPRET=1 is
set here, before the test modules import cuda_ops; kernel modules that another test imported
earlier in the session are re-imported so that their kernels pick the interpreter up.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    os.environ["TRITON_INTERPRET"] = "1"
    for name in ("cuda_ops.attention", "cuda_ops.mel", "cuda_ops.fp8", "cuda_ops.layernorm", "cuda_ops.cross_kv", "cuda_ops.cross_absorbed",
                 "cuda_ops.cross_int4", "cuda_ops.kv_write", "cuda_ops.decode_linear", "cuda_ops.sampler"):
        if name in sys.modules:
            importlib.reload(sys.modules[name])
