"""Session 31 (issue #12): `accurate` losing speech that three of its transcripts skip together.

The recording of tests/test_longform.py::test_accurate_keeps_speech_that_three_transcripts_sharing_a_cut_skip
(base, French: 2.9 s of floor noise, the 22.6-s menu prompt conf-adminmenu-menu8, 11.2 s, then
confbridge-rest-list-vol-out), and the crop of messy-fr-10-0 from 9.5 s (40 s) that it imitates.
Word errors (Whisper's basic normaliser, jiwer) of `accurate` with and without the skip rule,
`fast`, and faster-whisper's sequential transcription (same CTranslate2 weights), greedy and 5 beams.

    cd benchmarks && OMP_NUM_THREADS=1 PYTHONPATH=..:. python skip31.py --out acc31_skip.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np

from common import ct2_dir, manifest, write_json
from bench_live_accuracy import recording


def recordings() -> list[tuple[str, np.ndarray, str]]:
    from streamer.audio.decode import decode_audio
    from streamer.engine.request import SAMPLE_RATE as s

    rows = {Path(r["path"]).name: r for r in manifest("fr")}
    menu, after = rows["conf-adminmenu-menu8.ogg"], rows["confbridge-rest-list-vol-out.ogg"]
    audio = np.concatenate([np.zeros(int(2.9 * s), np.float32), decode_audio(menu["path"]), np.zeros(int(11.2 * s), np.float32),
                            decode_audio(after["path"])])
    audio += (np.random.default_rng(0).standard_normal(len(audio)) * 0.002).astype(np.float32)
    out = [("test-menu8", audio, menu["text"] + " " + after["text"])]
    rec = recording("messy-fr-10-0")
    t0, length = 9.5, 40.0
    out.append(("messy-fr-10-0[9.5:49.5]", rec["audio"][int(t0 * s):int((t0 + length) * s)],
                " ".join(t for a, b, t in rec["spans"] if a >= t0 and b <= t0 + length)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="acc31_skip.json")
    args = parser.parse_args()
    import jiwer
    from faster_whisper import WhisperModel

    import streamer.longform.accurate as accurate
    from common import normalizer
    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform import transcribe_long

    norm = normalizer("fr")

    def errors(ref: str, hyp: str) -> int:
        o = jiwer.process_words(norm(ref), norm(hyp))
        return o.substitutions + o.deletions + o.insertions

    engine = Engine.load(ModelConfig(model="base", device="cpu"), load_settings({"MODEL_ID": "base"}).engine)
    fw = WhisperModel(ct2_dir("base"), device="cpu", compute_type="float32", cpu_threads=1)
    fixed = accurate.SegmentVote

    def without_rule(*a, speech=None, **kw):  # the vote as before session 31
        return fixed(*a, **kw)

    rows = []
    for name, audio, ref in recordings():
        row = {"file": name, "reference_words": len(norm(ref).split())}
        for system in ("accurate", "accurate-before", "fast"):
            accurate.SegmentVote = without_rule if system == "accurate-before" else fixed
            t0 = time.perf_counter()
            text = asyncio.run(transcribe_long(engine, audio, mode=system.split("-")[0], options=DecodeOptions(language="fr"))).text
            row[system] = errors(ref, text)
            row[system + "_text"] = text
            row[system + "_wall_s"] = round(time.perf_counter() - t0, 1)
        accurate.SegmentVote = fixed
        for beam in (1, 5):
            segments, _ = fw.transcribe(audio, beam_size=beam, language="fr", vad_filter=False, condition_on_previous_text=True)
            text = "".join(s.text for s in segments)
            row[f"fw{beam}"], row[f"fw{beam}_text"] = errors(ref, text), text
        rows.append(row)
        print({k: v for k, v in row.items() if not k.endswith("_text")}, flush=True)
    engine.close()
    print("wrote", write_json(args.out, {"model": "base", "rows": rows}))


if __name__ == "__main__":
    main()
