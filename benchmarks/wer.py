"""WER of our engine vs faster-whisper on the same CTranslate2 weights and the same recordings.

Both sides: greedy (beam 1), no VAD, no timestamps, the same temperature fallback, Whisper's text
normaliser before jiwer. Ours submits every file at once (they share engine steps); faster-whisper
transcribes them one after another.

    python benchmarks/wer.py --model tiny.en --language en
    python benchmarks/wer.py --model base --language es --detect     # language detection on
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import ct2_dir, environment, manifest, table, wer, write_json


def ours(model: str, rows: list[dict], language: str | None, device: str,
         cpu_encoder: str = "auto") -> tuple[list[str], float, list[str]]:
    import torch

    from streamer.audio.decode import decode_audio
    from streamer.config import ModelConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions

    torch.set_num_threads(max(1, torch.get_num_threads()))
    engine = Engine.load(ModelConfig(model=model, device=device, cpu_encoder=cpu_encoder))
    audios = [decode_audio(r["path"]) for r in rows]

    from streamer.longform import transcribe_long

    async def one(audio):
        if len(audio) <= 30 * 16000:
            return await engine.transcribe(audio, DecodeOptions(language=language))
        # The few recordings over 30 s go through long-form (sequential windows, as faster-whisper does).
        return await transcribe_long(engine, audio, mode="accurate", options=DecodeOptions(language=language))

    async def run():
        return await asyncio.gather(*(one(a) for a in audios))

    t0 = time.perf_counter()
    results = asyncio.run(run())
    elapsed = time.perf_counter() - t0
    engine.close()
    return [r.text for r in results], elapsed, [r.language for r in results]


def faster_whisper(model: str, rows: list[dict], language: str | None) -> tuple[list[str], float, list[str]]:
    from faster_whisper import WhisperModel

    from streamer.audio.decode import decode_audio

    fw = WhisperModel(ct2_dir(model), device="cpu", compute_type="float32")
    audios = [decode_audio(r["path"]) for r in rows]
    texts, langs = [], []
    t0 = time.perf_counter()
    for a in audios:
        segments, info = fw.transcribe(a, beam_size=1, language=language, vad_filter=False, without_timestamps=True,
                                       condition_on_previous_text=False)
        texts.append("".join(s.text for s in segments).strip())
        langs.append(info.language)
    return texts, time.perf_counter() - t0, langs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--language", default="en", help="which recordings (en, es, fr)")
    p.add_argument("--detect", action="store_true", help="let both sides detect the language")
    p.add_argument("--limit", type=int, default=0, help="first N recordings only")
    p.add_argument("--device", default="cpu")
    p.add_argument("--per-file", action="store_true")
    args = p.parse_args()

    rows = manifest(args.language)
    if args.limit:
        rows = rows[: args.limit]
    lang = None if args.detect else args.language
    refs = [r["text"] for r in rows]
    audio_s = sum(r["duration"] for r in rows)
    our_texts, our_s, our_langs = ours(args.model, rows, lang, args.device)
    fw_texts, fw_s, fw_langs = faster_whisper(args.model, rows, lang)

    if args.per_file:
        for r, a, b in zip(rows, our_texts, fw_texts):
            print(f"{r['audio']}: ours {wer([r['text']], [a], args.language):.0f}%  fw {wer([r['text']], [b], args.language):.0f}%")
            print(f"  ref:  {r['text']}\n  ours: {a}\n  fw:   {b}")
    summary = [
        {"system": "streamer (ours)", "wer_%": wer(refs, our_texts, args.language), "wall_s": our_s, "rtf": audio_s / our_s,
         "lang_acc_%": 100 * sum(l == args.language for l in our_langs) / len(rows)},
        {"system": "faster-whisper fp32", "wer_%": wer(refs, fw_texts, args.language), "wall_s": fw_s, "rtf": audio_s / fw_s,
         "lang_acc_%": 100 * sum(l == args.language for l in fw_langs) / len(rows)},
    ]
    print(f"\n{args.model}, {len(rows)} {args.language} recordings, {audio_s / 60:.1f} min, "
          f"language {'detected' if args.detect else 'given'}; rtf = audio seconds / wall seconds")
    print(table(summary, ["system", "wer_%", "lang_acc_%", "wall_s", "rtf"]))
    out = write_json(f"wer_{args.model}_{args.language}{'_detect' if args.detect else ''}.json", {
        "command": "python benchmarks/wer.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (False, None, 0)),
        "environment": environment(), "files": len(rows), "audio_s": audio_s, "summary": summary,
        "per_file": [{"audio": r["audio"], "reference": r["text"], "ours": a, "faster_whisper": b}
                     for r, a, b in zip(rows, our_texts, fw_texts)]})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
