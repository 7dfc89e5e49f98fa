"""Instructions per element of the row-wise FP8 kernels, compiled for sm_90 on a machine without a
GPU (Triton's own ptxas and cuobjdump): these kernels are straight-line code per row, so the SASS
length over the elements a thread holds is what a row costs to issue. An H200 issues ~33 T thread-
instructions/s, so at N = 5120 and M = 24,000 rows 36 an element is ~130 us against ~90 us of memory.

    PYTHONPATH=. python benchmarks/sass_count.py [bias_gelu_quant|layer_norm_fp8 ...]

The local Triton may be newer than the GPU's: counts are leads, timings come from the H200.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from cuda_ops import fp8, layernorm  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def _kernels(n: int):
    launch = fp8.row_launch(n)
    shape = dict(SOFT_ROUND=False, BLOCK_M=launch.block_m, HEAD=launch.head, TAIL=launch.tail)
    yield ("bias_gelu_quant", fp8._bias_gelu_kernel, launch,
           {"h_ptr": "*fp16", "bias_ptr": "*fp16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"},
           dict(shape, HAS_BIAS=True, QUANTIZE=True))
    yield ("layer_norm_fp8", layernorm._layer_norm_kernel, fp8.row_launch(n // 4),
           {"x_ptr": "*fp16", "res_ptr": "*fp16", "res_out_ptr": "*fp16", "w_ptr": "*fp16", "b_ptr": "*fp16",
            "y_ptr": "*fp8e4nv", "scale_ptr": "*fp32"},
           dict(SOFT_ROUND=False, BLOCK_M=fp8.row_launch(n // 4).block_m, HEAD=fp8.row_launch(n // 4).head,
                TAIL=fp8.row_launch(n // 4).tail, HAS_RESIDUAL=True, OUT_FP8=True))


def count(name, fn, launch, pointers, constexprs, tmp) -> None:
    sig = {a: pointers.get(a, "constexpr" if a in constexprs else ("fp32" if a == "eps" else "i32")) for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if a in pointers or a.startswith("stride") or a in ("N", "D")}
    kernel = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=launch.num_warps))
    path = os.path.join(tmp, "k.cubin")
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", path], capture_output=True, text=True).stdout
    ins = [x for x in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", x)]
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x.split("*/", 1)[1].strip()).split()[0].rstrip(";") for x in ins)
    per_thread = launch.block_m * (launch.head + launch.tail) / (32 * launch.num_warps)
    print(f"{name:<16} N {constexprs['HEAD'] + constexprs['TAIL']:>5} ({launch.block_m} row, {launch.num_warps} warps): "
          f"{len(ins)} instructions, {len(ins) / per_thread:.1f} an element; top {ops.most_common(6)}")


if __name__ == "__main__":
    wanted = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn, launch, pointers, constexprs in _kernels(5120):
            if not wanted or name in wanted:
                count(name, fn, launch, pointers, constexprs, tmp)
