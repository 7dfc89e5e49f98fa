"""Compile the FP8 decode-attention sweep candidates for sm_90 on a machine without a GPU (Triton's
own ptxas and cuobjdump) and print, per launch: registers, spills (stack/local), shared memory,
programs per SM that fit (65536 registers, 64 warps, 228 KB), bytes of K/V a program has in flight
ahead of its math, and the main loop's SASS (instructions, 16-byte global / cp.async loads).

    PYTHONPATH=. python benchmarks/attn_sass.py [NAME_SUBSTRING ...]

The shapes are large-v3 cross-attention's (H=20, T=1500, D=64, contiguous [S, H, T, D] cache), the
specialisation the launcher gives (strides of 1 constant, multiples of 16 marked divisible). The
local Triton may be newer than the GPU's (3.9 here, 3.6 on the H200): counts are leads.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from bench_attention import sweep_candidates  # noqa: E402
from cuda_ops import attention as A  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTR = {"q_ptr": "*fp16", "k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
       "slot_ptr": "*i32", "len_ptr": "*i32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32",
       "lock_ptr": "*i32", "out_ptr": "*fp16"}
VALUES = dict(H=20, T=1500, stride_qb=1280, stride_qh=64, stride_qd=1, stride_ks=1920000, stride_kh=96000,
              stride_kt=64, stride_kd=1, stride_vs=1920000, stride_vh=96000, stride_vt=64, stride_vd=1,
              stride_kss=240, stride_ksh=12, stride_vss=240, stride_vsh=12, stride_ob=1280, stride_oh=64, stride_od=1)


def signature(fn, const_all: bool, flags: dict, values: dict):
    sig, const, attrs = {}, dict(flags), {}
    for i, n in enumerate(fn.arg_names):
        if n in flags:
            sig[n] = "constexpr"
        elif n == "qk_scale":
            sig[n] = "fp32"
        elif n in PTR:
            sig[n], attrs[(i,)] = PTR[n], [["tt.divisibility", 16]]
        elif const_all or values[n] == 1:
            sig[n], const[n] = "constexpr", values[n]
        else:
            sig[n] = "i32"
            if values[n] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, const, attrs


def main_loop(sass: str) -> list[str]:
    """The longest backward-branch body: the loop over position tiles."""
    ins = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    addr = lambda line: int(re.search(r"/\*([0-9a-f]{4})\*/", line).group(1), 16)  # noqa: E731
    best: list[str] = []
    for line in ins:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", line)
        if m and int(m.group(1), 16) < addr(line):
            body = [x for x in ins if int(m.group(1), 16) <= addr(x) <= addr(line)]
            best = body if len(body) > len(best) else best
    return best


def report(name: str, launch: A.Launch, tmp: str) -> None:
    splits = launch.splits or 1
    mode = 0 if splits == 1 else (2 if launch.one_pass else 1)
    values = {**VALUES, "num_splits": splits, "chunk": -(-12 // splits) * 128}
    common = dict(HAS_SCALE=True, TILE_SCALE=True, HAS_SLOTS=False, BLOCK_T=launch.block_t, SCALE_TILE=128,
                  HEAD_DIM=64, FULL_T=False)
    if launch.kernel == "v7":
        fn = A._decode_v7_kernel_const if launch.const else A._decode_v7_kernel
        flags = dict(common, SPLIT_MODE=mode, STAGES=launch.stages, BLOCK_S=1 << (splits - 1).bit_length(),
                     SCALAR_SCALES=launch.scalar_scales)
        stages = max(1, launch.stages)
    else:
        fn = A._decode_partial_kernel_const if launch.const else A._decode_partial_kernel
        flags = dict(common, SINGLE_SPLIT=mode == 0, PREFETCH=False, MMA=False)
        stages = A.NUM_STAGES
    options = dict(num_warps=launch.num_warps, num_stages=stages)
    if launch.maxnreg:
        options["maxnreg"] = launch.maxnreg
    kernel = triton.compile(ASTSource(fn, *signature(fn, launch.const, flags, values)), target=GPUTarget("cuda", 90, 32),
                            options=options)
    path = os.path.join(tmp, "k.cubin")
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", path], capture_output=True, text=True).stdout
    regs, stack, smem = (int(re.search(rf"{k}:(\d+)", res).group(1)) for k in ("REG", "STACK", "SHARED"))
    dyn = kernel.metadata.shared
    w = launch.num_warps
    fit = min(65536 // (-(-regs // 8) * 8 * 32 * w), 64 // w, 32, (228 * 1024) // (smem + dyn + 1024))
    tile = launch.block_t * 64 * 2
    ahead = (launch.stages - 1) * tile if launch.kernel == "v7" and launch.stages >= 2 else tile
    loop = main_loop(subprocess.run([f"{BIN}/cuobjdump", "-sass", path], capture_output=True, text=True).stdout)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x.split("*/", 1)[1].strip()).split()[0].rstrip(";") for x in loop)
    vec = ops["LDG.E.128"] + ops["LDGSTS.E.BYPASS.128"]
    print(f"{name:<32} regs {regs:>3} stack {stack:>3} smem {smem + dyn:>6} B  fit {fit:>2}/SM  ahead {ahead // 1024:>2} KB "
          f"({fit * ahead // 1024:>3} KB/SM)  loop {len(loop):>3} instr / {launch.block_t} positions, "
          f"16-B loads {vec}, F2FP {ops['F2FP.F16.E4M3.UNPACK_B']}", flush=True)


if __name__ == "__main__":
    wanted = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        for name, launch in sweep_candidates():
            if wanted and not any(w in name for w in wanted):
                continue
            try:
                report(name, launch, tmp)
            except Exception as e:  # noqa: BLE001
                print(f"{name:<32} FAILED {repr(e)[:200]}")
