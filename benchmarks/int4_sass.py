"""Compile the 4-bit decode-attention kernels (cuda_ops/cross_int4.py, v1 and v2) and the FP8 v7 kernel
the engine runs at B >= 128 for sm_90 on a machine without a GPU, and print per launch: registers,
spills, the main loop's SASS instructions (attn_sass.py's method: the longest backward-branch body)
and thread-instructions per position = loop instructions x 32 x warps / positions per loop step.

    PYTHONPATH=. python benchmarks/int4_sass.py [--dump DIR]

Shapes: large-v3 cross-attention (H=20, T=1500, D=64), the specialisation the launchers give
(strides of 1 constant, multiples of 16 marked divisible). `--splits` compiles v2 for each split
count the launcher can pick at T=1500 (1, 2, 3, 4, 6, 12) and the head dims of tiny (D=64 too).
"""

from __future__ import annotations

import argparse
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

import attn_sass  # noqa: E402
from cuda_ops import attention as A  # noqa: E402
from cuda_ops import cross_int4 as C  # noqa: E402

BIN = attn_sass.BIN
H, T, D = 20, 1500, 64
TILES = -(-T // 128)


def _sig(fn, flags: dict, types: dict, values: dict):
    sig, const, attrs = {}, dict(flags), {}
    for i, n in enumerate(fn.arg_names):
        if n in flags:
            sig[n] = "constexpr"
        elif n in types:
            sig[n] = types[n]
            if types[n].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif values[n] == 1:
            sig[n], const[n] = "constexpr", 1
        else:
            sig[n] = "i32"
            if values[n] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, const, attrs


def other_loops(sass: str, main: list[str]) -> list[int]:
    """Instruction counts of the other backward-branch bodies outside the main loop (v2: the prologue's
    loop over the split's 128-position tiles, which runs once per tile)."""
    ins = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    addr = lambda line: int(re.search(r"/\*([0-9a-f]{4})\*/", line).group(1), 16)  # noqa: E731
    inside = {addr(x) for x in main}
    out = []
    for line in ins:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", line)
        if m and int(m.group(1), 16) < addr(line) and addr(line) not in inside:
            out.append(len([x for x in ins if int(m.group(1), 16) <= addr(x) <= addr(line)]))
    return out


def compile_and_count(name, fn, flags, types, values, warps, stages, positions, tmp, dump=None, maxnreg=0):
    options = dict(num_warps=warps, num_stages=stages)
    if maxnreg:
        options["maxnreg"] = maxnreg
    kernel = triton.compile(ASTSource(fn, *_sig(fn, flags, types, values)), target=GPUTarget("cuda", 90, 32),
                            options=options)
    path = os.path.join(tmp, "k.cubin")
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", path], capture_output=True, text=True).stdout
    regs, stack = (int(re.search(rf"{k}:(\d+)", res).group(1)) for k in ("REG", "STACK"))
    sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", path], capture_output=True, text=True).stdout
    loop = attn_sass.main_loop(sass)
    others = other_loops(sass, loop)
    if dump:
        safe = re.sub(r"\W+", "_", name)
        with open(os.path.join(dump, f"{safe}.sass"), "w") as f:
            f.write(sass)
        with open(os.path.join(dump, f"{safe}.ptx"), "w") as f:
            f.write(kernel.asm["ptx"])
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x.split("*/", 1)[1].strip()).split()[0].rstrip(";")
                              for x in loop)
    per_pos = len(loop) * 32 * warps / positions
    top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
    smem = kernel.metadata.shared
    fit = min(65536 // (-(-regs // 8) * 8 * 32 * warps), 64 // warps, 32, (228 * 1024) // (smem + 1024))
    extra = "".join(f" + other loop {n} instr ({n * 32 * warps / 128:.0f}/position if once per 128)" for n in others)
    print(f"{name:<34} regs {regs:>3} stack {stack:>3} smem {smem:>6} B fit {fit:>2}/SM  "
          f"loop {len(loop):>4} instr / {positions:>3} positions x "
          f"{warps} warps = {per_pos:6.0f} thread-instr/position{extra}  [{top}]", flush=True)
    return per_pos


def fp8_v7(tmp, dump, quick=False):
    """The FP8 tile kernel as FP8_TILE_TABLE runs it at B >= 128 (and B = 32) and at B = 64."""
    for label, launch in (("fp8 v7 32x4w s5 r64 ss (B>=128)", A.FP8_TILE_TABLE[-1][1]),
                          ("fp8 v7 64x4w s3 r96 (B=64)", A.FP8_TILE_TABLE[2][1]))[:1 if quick else 2]:
        types = {**attn_sass.PTR, "qk_scale": "fp32"}
        values = {**attn_sass.VALUES, "num_splits": 1, "chunk": TILES * 128}
        flags = dict(HAS_SCALE=True, TILE_SCALE=True, HAS_SLOTS=False, BLOCK_T=launch.block_t, SCALE_TILE=128,
                     HEAD_DIM=64, FULL_T=False, SPLIT_MODE=0, STAGES=launch.stages, BLOCK_S=1,
                     SCALAR_SCALES=launch.scalar_scales)
        compile_and_count(label, A._decode_v7_kernel, flags, types, values, launch.num_warps, launch.stages,
                          launch.block_t, tmp, dump, launch.maxnreg)


def int4_v1(tmp, dump):
    types = {"q_ptr": "*fp16", "k_ptr": "*i32", "v_ptr": "*i32", "ks_ptr": "*fp16", "vs_ptr": "*fp16",
             "slot_ptr": "*i32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32",
             "out_ptr": "*fp16", "qk_scale": "fp32"}
    values = dict(H=H, T=T, chunk=TILES * 128, stride_qb=H * D, stride_qh=D, stride_cs=H * T * D // 8,
                  stride_ch=T * D // 8, stride_kss=H * TILES * D, stride_ksh=TILES * D, stride_kst=D,
                  stride_vss=H * T, stride_vsh=T, stride_ob=H * D, stride_oh=D, num_splits=1)
    bt, w, st = C.BLOCK_T, C.NUM_WARPS, C.STAGES
    flags = dict(HAS_SLOTS=False, BLOCK_T=bt, SCALE_TILE=128, WORDS=D // 8, STAGES=st)
    compile_and_count(f"int4 v1 {bt}x{w}w s{st} (default)", C._decode_int4_kernel, flags, types, values, w, max(1, st),
                      bt, tmp, dump)


def int4_v2(tmp, dump, warps, stages, splits=1, h=H, d=D, slots=False, label=""):
    types = {"q_ptr": "*fp16", "k_ptr": "*i64", "v_ptr": "*i64", "ks_ptr": "*fp16", "vs_ptr": "*fp16",
             "slot_ptr": "*i32", "qs_ptr": "*i32", "qd_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32",
             "part_acc_ptr": "*fp32", "out_ptr": "*fp16", "qk_scale": "fp32"}
    chunk = -(-TILES // splits) * 128
    values = dict(H=h, T=T, chunk=chunk, n_tiles=TILES, stride_qb=h * d, stride_qh=d, stride_cs=h * T * d // 16,
                  stride_ch=T * d // 16, stride_kss=h * TILES * d, stride_ksh=TILES * d, stride_kst=d,
                  stride_vss=h * T, stride_vsh=T, stride_ob=h * d, stride_oh=d, num_splits=-(-T // chunk))
    flags = dict(HAS_SLOTS=slots, G=16, E=d // 16, HALF=d // 2, STAGES=stages, USE_ASM=True)
    name = label or f"int4 v2 1w s{stages} split{values['num_splits']}"
    return compile_and_count(name, C._decode_int4_v2_kernel, flags, types, values, warps, max(1, stages), 128, tmp,
                             dump)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", help="write each kernel's SASS and PTX here")
    ap.add_argument("--splits", action="store_true", help="also compile v2 for every split count and tiny's H")
    ap.add_argument("--only", default="fp8,v1,v2")
    ap.add_argument("--quick", action="store_true", help="FP8 v7, v1 and v2 at 3 stages only")
    args = ap.parse_args()
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "fp8" in args.only:
            fp8_v7(tmp, args.dump, args.quick)
        if "v1" in args.only:
            int4_v1(tmp, args.dump)
        if "v2" in args.only:
            for st in (3,) if args.quick else (2, 3, 4):
                int4_v2(tmp, args.dump, 1, st)
        if args.splits:  # every split count the launcher can pick at T = 1500, tiny's H, slots
            for sp in (2, 3, 4, 6, 12):
                int4_v2(tmp, args.dump, 1, C.V2_STAGES, splits=sp)
            int4_v2(tmp, args.dump, 1, C.V2_STAGES, h=6, label="int4 v2 tiny H=6")
            int4_v2(tmp, args.dump, 1, C.V2_STAGES, splits=3, slots=True, label="int4 v2 slots split3")
