"""WER per preset from the transcripts a `bench_engine.py --real` run wrote (the GPU machine has no
normaliser or jiwer: this runs where the references live), and how many greedy transcripts equal
the plain model's (`none`) and full_fp16's.

    python benchmarks/transcript_wer.py RESULT.json [RESULT.json ...]

References: `text` of ../shared/audio/manifest.jsonl (STREAMER_AUDIO_DIR), matched by file name
(`en__asterisk__x.ogg` is `en/asterisk/x.ogg`). Targets (issue 15): FP8 presets within 0.3 WER
points of full_fp16; full_fp16's transcripts equal to the plain model's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import AUDIO_DIR, table, wer


def rows_of(report: dict, refs: dict[str, str]) -> list[dict]:
    out = []
    for model, t in report.get("transcripts", {}).items():
        files = [f.replace("__", "/") for f in t["files"]]
        missing = [f for f in files if f not in refs]
        if missing:
            raise SystemExit(f"{model}: no reference text for {missing[:3]}")
        references = [refs[f] for f in files]
        systems = {k: v for k, v in t.items() if k != "files"}
        base = {k: systems.get(k) for k in ("plain", "full_fp16")}
        full = None
        for name, texts in systems.items():
            n = min(len(texts), len(references))
            row = {"model": model, "system": name, "files": n, "wer_pct": round(wer(references[:n], texts[:n], "en"), 2)}
            for b, other in base.items():
                row[f"equal_to_{b}"] = None if other is None else sum(x.strip() == y.strip() for x, y in zip(texts, other))
            if name == "full_fp16":
                full = row["wer_pct"]
            out.append(row)
        for row in out:
            if row["model"] == model and full is not None:
                row["minus_full_fp16"] = round(row["wer_pct"] - full, 2)
    return out


def main() -> None:
    refs = {}
    for line in (AUDIO_DIR / "manifest.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            refs[r["audio"]] = r["text"]
    rows = []
    for path in sys.argv[1:]:
        p = Path(path)
        if p.exists():
            rows += [dict(r, file=p.name) for r in rows_of(json.loads(p.read_text()), refs)]
    print(table(rows, ["file", "model", "system", "files", "wer_pct", "minus_full_fp16", "equal_to_plain", "equal_to_full_fp16"]))


if __name__ == "__main__":
    main()
