"""Engine throughput on a GPU: ours vs stock transformers vs the bandwidth/compute floor.

For Whisper large-v3 and large-v3-turbo *shapes* with random fp16 weights (speed only: the text is
meaningless) every window decodes a fixed number of tokens (end-of-text is suppressed), so both
systems do the same work. For real weights (a CTranslate2 or Hugging Face directory) on real audio
the transcripts are written out too (WER is computed where the references and normaliser live).

    python benchmarks/bench_engine.py --shapes large-v3,large-v3-turbo --batches 1,8,32,128,256
    python benchmarks/bench_engine.py --real tiny.en=/path/to/model --audio clips.npz
    ... --baseline benchmarks/results/bench_engine_presets_h200.json [--baseline OTHER.json]

Each row is the fastest of `--repeats` timed runs after a warm-up (3; one before session 33), ours and
transformers alike, so that one slow lease of the host does not set a ratio (`walls_s` keeps them all).

With --baseline, every row is printed with its ratio to the recorded runs (the fastest of the
files for that row, `baseline.py`) and rows more than 10 % slower are flagged; the exit status is
then 3 (after everything is written).

Floors: a decoder step must read the decoder weights once plus each live sequence's cross- and
self-attention K/V: bytes / measured copy bandwidth. An encoder window costs its FLOPs / measured
fp16 matmul rate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time

import numpy as np
import torch

import baseline
from common import environment, table, write_json

SHAPES = {
    "large-v3": dict(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32, n_vocab=51866,
                     n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=32),
    "large-v3-turbo": dict(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                           n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=4),
}


def ceilings() -> dict:
    """Measured device-to-device copy bandwidth (bytes read + written) and fp16 matmul rate."""
    return {"copy_GBps": _copy_bandwidth() / 1e9, "fp16_matmul_TFLOPs": _matmul_rate() / 1e12}


def _copy_bandwidth() -> float:
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() / _cuda_time(lambda: y.copy_(x), 10)


def _matmul_rate() -> float:
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    return 2 * 8192**3 / _cuda_time(lambda: a @ b, 10)


def _cuda_time(fn, reps: int) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / reps


def random_model(shape: str, tokenizer_json: str, device: str = "cuda"):
    from streamer.model.tokenizer import Tokenizer
    from streamer.model.weights import LoadedModel
    from streamer.model.whisper import ModelDims, Whisper

    dims = ModelDims(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model = Whisper(dims).half().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    tok = Tokenizer(tokenizer_json, multilingual=True)
    # End-of-text suppressed: every window decodes exactly max_new_tokens (a fixed forced length).
    return LoadedModel(model=model, tokenizer=tok, name=f"{shape} (random fp16)", suppress_tokens=[tok.eot],
                       begin_suppress_tokens=[tok.eot])


def encoder_flops(d) -> float:
    t, w = d.n_audio_ctx, d.n_audio_state
    conv = 2 * (3000 * d.n_mels * w * 3 + t * w * w * 3)
    per_layer = 2 * t * (4 * w * w + 8 * w * w) + 4 * t * t * w
    return conv + d.n_audio_layer * per_layer


def bench_ours(loaded, audios: list[np.ndarray], batches: list[int], tokens: int | None, ceil: dict,
               precision: str | None = None, encoder_batch: int = 16, repeats: int = 1) -> list[dict]:
    from streamer.config import EngineConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.model.whisper import KVCache

    # "PRESET+overlap": the preset with the encoder on a second stream (EngineConfig.overlap_encoder);
    # "PRESET+overlapN": and N SMs for the decode steps while a pass runs (EngineConfig.step_sms);
    # "PRESET+nofill": every step decodes, also while windows are still admitted (fill_files_first off).
    precision, _, variant = (precision or "").partition("+")
    overlap, sms = variant.startswith("overlap"), variant.removeprefix("overlap")
    if variant not in ("", "nofill") and not (overlap and (sms == "" or sms.isdigit())):
        raise ValueError(f"{variant!r}: a variant is overlap, overlapN (N SMs for the steps) or nofill")
    engine = Engine(loaded, EngineConfig(max_slots=max(batches), max_encoder_batch=encoder_batch,
                                         overlap_encoder=overlap, fill_files_first=variant != "nofill",
                                         step_sms=int(sms or 0) if overlap else 0),
                    precision=None if precision in ("", "none") else precision)
    label = f"ours {precision or 'plain'}" + (f"+{variant}" if variant else "")
    loop = asyncio.new_event_loop()
    options = DecodeOptions(language="en", temperatures=(0.0,), max_new_tokens=tokens)
    rows = []
    for n in batches:
        clips = [audios[i % len(audios)] for i in range(n)]

        async def run():
            return await asyncio.gather(*(engine.transcribe(a, options) for a in clips))

        loop.run_until_complete(run())  # warm-up at this size
        walls = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            results = loop.run_until_complete(run())
            walls.append(time.perf_counter() - t0)
        wall = min(walls)
        n_tok = sum(len(r.tokens) + 1 for r in results)
        rows.append({"system": label, "windows": n, "wall_s": wall, "walls_s": walls,
                     "rtf": sum(len(a) for a in clips) / 16000 / wall,
                     "tokens_per_s": n_tok / wall, "texts": [r.text for r in results]})
    # Decoder step alone (graph replay) and encoder throughput.
    runner = engine.runner
    for n in batches:
        b = runner.bucket(n)
        graph = runner.graphs[b][0] if b in runner.graphs else None
        if graph is None:
            continue
        before = runner.positions[:b].float().mean().item()
        ms = 1000 * _cuda_time(graph.replay, 20)
        after = runner.positions[:b].float().mean().item()  # each replay advances every row
        # Bytes a step must read: the decoder's weights as stored (FP8 sites take one byte per
        # weight) and, per sequence, the self K/V of its valid positions (mean over the timed
        # replays; until session 12 the whole 448-position cache was counted, which overstated the
        # floor by up to 4.4 ms at 256 large-v3 rows) and its cross K/V as cached (FP8 or fp16).
        decoder = engine.loaded.model.decoder  # the preset's modules (FP8 sites)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()  # a view counted once
                    for t in [*decoder.parameters(), *decoder.buffers()]}
        dec_bytes = sum(storages.values())
        kv = KVCache.bytes_per_slot(loaded.dims, runner.cache.layers[0].self_k.element_size(), runner.cache.read_format(b),
                                    self_len=(before + after) / 2 + 1)  # a hybrid cache: the format this bucket reads
        floor = 1000 * (dec_bytes + b * kv) / (ceil["copy_GBps"] * 1e9)
        for r in rows:
            if r["windows"] == n:
                r.update(step_ms=ms, step_floor_ms=floor, step_over_floor=ms / floor)
    mel = torch.randn(16, loaded.dims.n_mels, 3000, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        t = _cuda_time(lambda: engine.loaded.model.encoder(mel), 5)
    flops = encoder_flops(loaded.dims)
    enc = {"encoder_windows_per_s": 16 / t, "encoder_TFLOPs": 16 * flops / t / 1e12,
           "encoder_pct_of_matmul": 100 * 16 * flops / t / 1e12 / ceil["fp16_matmul_TFLOPs"]}
    engine.close()
    return rows, enc


def bench_transformers(loaded, audios, batches, tokens: int | None, repeats: int = 1) -> list[dict]:
    import transformers

    from streamer.audio.features import log_mel_spectrogram
    from streamer.model.weights import hf_configs, to_hf_state_dict

    config, generation = hf_configs(loaded)
    cfg = transformers.WhisperConfig(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = transformers.WhisperForConditionalGeneration(cfg)
    hf.load_state_dict(to_hf_state_dict(loaded.model), assign=True, strict=False)
    hf.tie_weights()
    hf = hf.to("cuda", torch.float16).eval()
    hf.generation_config = transformers.GenerationConfig(**generation)
    rows = []
    for n in batches:
        clips = [audios[i % len(audios)] for i in range(n)]
        try:
            feats = log_mel_spectrogram(clips, loaded.dims.n_mels, device="cuda").half()
            kw = dict(max_new_tokens=tokens, min_new_tokens=tokens) if tokens else dict(max_new_tokens=224)
            if loaded.tokenizer.multilingual:
                kw.update(language="en", task="transcribe")
            with torch.inference_mode():
                hf.generate(feats, **kw)  # warm-up
                walls = []
                for _ in range(repeats):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = hf.generate(feats, **kw)
                    torch.cuda.synchronize()
                    walls.append(time.perf_counter() - t0)
                wall = min(walls)
            n_tok = int((out != loaded.tokenizer.eot).sum())
            rows.append({"system": "transformers", "windows": n, "wall_s": wall, "walls_s": walls,
                         "rtf": sum(len(a) for a in clips) / 16000 / wall, "tokens_per_s": n_tok / wall,
                         "texts": [loaded.tokenizer.decode(o.tolist()) for o in out]})
        except torch.OutOfMemoryError:
            rows.append({"system": "transformers", "windows": n, "wall_s": None, "note": "out of memory"})
            torch.cuda.empty_cache()
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="large-v3,large-v3-turbo")
    p.add_argument("--batches", default="1,8,32,128,256")
    p.add_argument("--tokens", type=int, default=100, help="forced decode length for random-weight shapes")
    p.add_argument("--tokenizer", required=True, help="a multilingual tokenizer.json (for the random shapes)")
    p.add_argument("--audio", required=True, help=".npz of float16 16 kHz clips (key = file name)")
    p.add_argument("--real", action="append", default=[], help="NAME=DIR: real weights on real audio")
    p.add_argument("--hf-batches", default="1,8,32,128")
    p.add_argument("--encoder-batch", type=int, default=16,
                   help="windows encoded together (EngineConfig.max_encoder_batch; the committed runs used 16)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per row, ours and transformers alike; the row is the fastest (transformers' "
                        "host-bound generate moved 2.81-3.34 s at 128 large-v3 windows between H100 leases, "
                        "session 33). Runs before session 33 timed one")
    p.add_argument("--out", default="bench_engine.json")
    p.add_argument("--baseline", action="append", default=[], help="a recorded bench_engine JSON to compare with (repeatable)")
    p.add_argument("--precisions", default="none", help="comma list: none (plain PyTorch), full_fp16, mixed_fp8, aggressive_fp8; "
                   "PRESET+overlap runs the encoder on a second CUDA stream, PRESET+nofill decodes in every step")
    args = p.parse_args()

    batches = [int(x) for x in args.batches.split(",")]
    hf_batches = [int(x) for x in args.hf_batches.split(",") if x]  # "": no transformers rows
    data = np.load(args.audio)
    names = sorted(data.files)
    clips = [data[k].astype(np.float32) for k in names]
    window = np.concatenate(clips)[: 30 * 16000]  # one full 30-s window of speech for the shapes
    ceil = ceilings()
    print("ceilings:", ceil, flush=True)
    report = {"environment": environment(), "ceilings": ceil, "tokens_forced": args.tokens,
              "encoder_batch": args.encoder_batch, "repeats": args.repeats, "runs": []}
    baselines = baseline.load(args.baseline)

    def against_baseline(runs: list[dict]) -> list[dict]:
        rows = baseline.compare({"tokens_forced": args.tokens, "runs": runs}, baselines)
        if rows:
            print("against the baseline (slower_x > 1: slower; flagged past 1.10):")
            print(table(rows, baseline.COLUMNS), flush=True)
        return rows

    def record(label, ours_rows, enc, hf_rows):
        report["runs"].append({"model": label, "ours": ours_rows, "encoder": enc, "transformers": hf_rows})
        for o in ours_rows:
            h = next((h for h in hf_rows if h["windows"] == o["windows"] and h.get("wall_s")), None)
            o["speedup_vs_transformers"] = (h["wall_s"] / o["wall_s"]) if h else None
        print(f"\n{label}  encoder: {enc}")
        print(table(ours_rows + hf_rows, ["system", "windows", "wall_s", "rtf", "tokens_per_s", "step_ms",
                                          "step_floor_ms", "step_over_floor", "speedup_vs_transformers"]), flush=True)
        if baselines:
            against_baseline(report["runs"][-1:])
        write_json(args.out, report)

    precisions = [None if p == "none" else p for p in args.precisions.split(",")]

    def each_precision(make, audios, run_batches, tokens, label, transcripts=None):
        hf_run = [b for b in hf_batches if b <= max(run_batches)]
        hf_rows = bench_transformers(make(), audios, hf_run, tokens, args.repeats) if hf_run else []
        if transcripts is not None and hf_rows:
            transcripts["transformers"] = hf_rows[-1].get("texts", [])[: len(names)]
        for precision in precisions:
            try:
                rows, enc = bench_ours(make(), audios, run_batches, tokens, ceil, precision, args.encoder_batch,
                                       args.repeats)
            except Exception as e:  # one preset failing must not lose the others' numbers
                import traceback

                traceback.print_exc()
                report.setdefault("errors", []).append(f"{label} {precision}: {e!r}")
                continue
            if transcripts is not None:
                transcripts[precision or "plain"] = rows[-1]["texts"][: len(names)]
            for r in rows:
                r.pop("texts", None)
            record(f"{label}, precision {precision or 'plain'}", rows, enc, [dict(h, texts=None) for h in hf_rows])
            gc.collect()
            torch.cuda.empty_cache()

    from streamer.model.weights import load_model

    for spec in args.real:
        name, path = spec.split("=", 1)

        def make():
            loaded = load_model(path, "cuda", torch.float16)
            loaded.name = name
            return loaded

        transcripts = report.setdefault("transcripts", {}).setdefault(name, {"files": names})
        each_precision(make, clips, [b for b in batches if b <= 128], None, f"{name} (real weights, real audio)", transcripts)

    for shape in [s for s in args.shapes.split(",") if s]:
        each_precision(lambda: random_model(shape, args.tokenizer), [window], batches, args.tokens,
                       f"{shape} (random fp16 weights, {args.tokens} forced tokens: speed only)")

    status = 0
    if baselines:
        rows = baseline.compare(report, baselines)
        flagged = [r for r in rows if r["flag"]]
        report["baseline"] = {"files": args.baseline, "rows": rows, "flagged": len(flagged),
                              "not_in_baseline": [list(k) for k in baseline.unmatched(report, baselines)]}
        write_json(args.out, report)
        print(f"\nbaseline: {len(flagged)} of {len(rows)} compared rows more than 10 % slower")
        if flagged:
            print(table(flagged, baseline.COLUMNS))
            status = 3
    print(json.dumps({"done": True}))
    raise SystemExit(status)


if __name__ == "__main__":
    main()
