"""A long upload built reproducibly from ../shared/audio: the English prompts in a seeded order,
joined with 0.5-3 s pauses under a low noise floor, encoded with PyAV as Ogg/Opus (mono, 16 kHz,
32 kbit/s, as the shared recordings are) and written piece by piece, so that a 4-hour file never
sits in memory as samples. Beside it, `<file>.json` holds the reference text.

    python benchmarks/make_long_upload.py --hours 1 --out /tmp/long_1h.ogg      # 13 MB, ~40 s
    python benchmarks/make_long_upload.py --seconds 14399 --out /tmp/long_4h.ogg

A file of exactly 4 h is refused by the server's 4-hour limit (`MAX_AUDIO_S`): Ogg/Opus declares a
duration 6.5 ms past its last sample, and the limit judges the declared duration first.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from fractions import Fraction

import av
import numpy as np

from common import manifest

from streamer.audio import SAMPLE_RATE
from streamer.audio.decode import decode_audio

PAUSE_S = (0.5, 3.0)
"""Pause between two prompts, uniform in this range: about 80 % of the file is speech, as in a
talk or a meeting, so that the long-form path has as many windows as a real long upload."""
FLOOR_RMS = 0.002
"""Noise floor in the pauses (about -54 dBFS): a real room is never digitally silent."""
BIT_RATE = 32000


def write_long_upload(path: str, seconds: float, seed: int = 0) -> tuple[float, str]:
    """Write the file; returns its length in seconds and the reference text."""
    rng = np.random.default_rng(seed)
    rows = sorted(manifest("en"), key=lambda r: r["audio"])
    prompts = [(np.clip(np.round(decode_audio(r["path"]) * 32767), -32768, 32767).astype(np.int16), r["text"])
               for r in rows]
    limit = int(seconds * SAMPLE_RATE)
    written = 0
    texts: list[str] = []
    with av.open(path, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=SAMPLE_RATE, layout="mono")
        stream.bit_rate = BIT_RATE

        def put(pcm: np.ndarray) -> None:
            nonlocal written
            frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.time_base = Fraction(1, SAMPLE_RATE)
            frame.pts = written
            written += len(pcm)
            container.mux(stream.encode(frame))

        order: list[int] = []
        while True:
            if not order:  # every prompt once, in a new order each round
                order = rng.permutation(len(prompts)).tolist()
            pcm, text = prompts[order.pop()]
            pause = int(rng.uniform(*PAUSE_S) * SAMPLE_RATE)
            if written + len(pcm) + pause > limit:
                break
            put(pcm)
            texts.append(text)
            put(np.round(rng.standard_normal(pause) * FLOOR_RMS * 32767).astype(np.int16))
        if written < limit:  # the rest is pause, so that the file is as long as asked
            put(np.round(rng.standard_normal(limit - written) * FLOOR_RMS * 32767).astype(np.int16))
        container.mux(stream.encode(None))
    return written / SAMPLE_RATE, " ".join(texts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=None, help="the length in seconds (instead of --hours)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the .ogg to write (not in the repository: tens of MB)")
    args = p.parse_args()
    t = time.perf_counter()
    seconds, reference = write_long_upload(args.out, args.seconds or args.hours * 3600, args.seed)
    with open(args.out + ".json", "w") as f:
        json.dump({"seconds": seconds, "seed": args.seed, "reference": reference}, f)
    size = os.path.getsize(args.out) / 2**20
    print(f"wrote {args.out}: {seconds / 3600:.2f} h, {size:.1f} MB, in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
