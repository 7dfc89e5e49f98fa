"""Benchmark Whisper's log-mel on CUDA: the PyTorch reference against torch.stft + our fused kernels.

For batches of 1, 16 and 64 windows of 30 s (480000 samples -> [B, 128, 3000]), times
(a) log_mel_reference on the GPU (torch.stft + abs^2, matmul, log10, max ops),
(b) log_mel: torch.stft + the two Triton kernels,
and the part after the STFT alone for both (the STFT is shared), with the kernels' GB/s.
For context, transformers' WhisperFeatureExtractor on one window on the CPU (its numpy path).
GPU times: triton.testing.do_bench medians; CPU: median of 5 wall-clock runs. Writes JSON under
benchmarks/results (or $BENCH_RESULTS_DIR).

    python benchmarks/bench_mel.py [--n-mels 128] [--out bench_mel.json]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from common import environment, write_json  # also puts the checkout on sys.path for cuda_ops
from cuda_ops.mel import N_FFT, log_mel, log_mel_from_stft, log_mel_reference, mel_filters

WINDOW = 480_000  # 30 s at 16 kHz
BATCHES = (1, 16, 64)


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def reference_tail(stft: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """log_mel_reference's ops after the STFT, to time against the fused kernels alone."""
    log_spec = torch.clamp(filters @ (stft[..., :-1].abs() ** 2), min=1e-10).log10()
    return (torch.maximum(log_spec, log_spec.amax(dim=(1, 2), keepdim=True) - 8.0) + 4.0) / 4.0


def feature_extractor_cpu_ms(n_mels: int) -> dict:
    """transformers' WhisperFeatureExtractor on one 30-s window, CPU: its numpy path and __call__."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=n_mels)
    audio = np.random.default_rng(0).standard_normal(WINDOW).astype(np.float32) * 0.1
    result = {}
    runs = {"call": lambda: fe(audio, sampling_rate=16000, return_tensors="np")}
    if hasattr(fe, "_np_extract_fbank_features"):  # private; absent in some versions
        runs["numpy"] = lambda: fe._np_extract_fbank_features(audio[None], "cpu")
    for name, fn in runs.items():
        fn()
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        result[name] = 1e3 * float(np.median(samples))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-mels", type=int, default=128, choices=(80, 128))
    parser.add_argument("--out", default="bench_mel.json", help="file name under the results directory")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA not available: nothing to benchmark (the kernels' CPU tests run through TRITON_INTERPRET=1)")
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference in fp32, as on the CPU
    n_mels = args.n_mels
    filters = mel_filters(n_mels).cuda()
    window = torch.hann_window(N_FFT, device="cuda")
    rows = []
    for B in BATCHES:
        audio = torch.randn(B, WINDOW, device="cuda") * 0.1
        stft = torch.stft(audio, N_FFT, 160, window=window, return_complex=True)
        ours = log_mel(audio, n_mels)
        max_diff = (ours - log_mel_reference(audio, n_mels)).abs().max().item()
        t = {
            "reference_ms": bench(lambda: log_mel_reference(audio, n_mels)),
            "ours_ms": bench(lambda: log_mel(audio, n_mels)),
            "stft_ms": bench(lambda: torch.stft(audio, N_FFT, 160, window=window, return_complex=True)),
            "reference_tail_ms": bench(lambda: reference_tail(stft, filters)),
            "kernels_ms": bench(lambda: log_mel_from_stft(stft, filters)),
        }
        frames = ours.shape[2]
        # pass 1 reads the spectrum and writes the log-mel; pass 2 reads and writes the log-mel
        kernel_bytes = stft.numel() * 8 + 3 * B * n_mels * frames * 4
        rows.append({
            "B": B, **t, "max_abs_diff": max_diff,
            "reference_windows_per_s": B / t["reference_ms"] * 1e3,
            "ours_windows_per_s": B / t["ours_ms"] * 1e3,
            "speedup": t["reference_ms"] / t["ours_ms"],
            "tail_speedup": t["reference_tail_ms"] / t["kernels_ms"],
            "kernels_GBps": kernel_bytes / t["kernels_ms"] / 1e6,
        })  # fmt: skip
    cpu = feature_extractor_cpu_ms(n_mels)

    print(f"\nlog-mel, {n_mels} mels, 30-s windows; GPU times are medians in ms")
    print(f"{'B':>4}{'reference':>11}{'ours':>9}{'speedup':>9}{'win/s ref':>11}{'win/s ours':>12}"
          f"{'stft':>8}{'tail ref':>10}{'kernels':>9}{'tail x':>8}{'GB/s':>7}{'max diff':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['B']:>4}{r['reference_ms']:>11.3f}{r['ours_ms']:>9.3f}{r['speedup']:>8.2f}x"
              f"{r['reference_windows_per_s']:>11.0f}{r['ours_windows_per_s']:>12.0f}{r['stft_ms']:>8.3f}"
              f"{r['reference_tail_ms']:>10.3f}{r['kernels_ms']:>9.3f}{r['tail_speedup']:>7.2f}x"
              f"{r['kernels_GBps']:>7.0f}{r['max_abs_diff']:>10.1e}")  # fmt: skip
    print("transformers WhisperFeatureExtractor, 1 window on the CPU: "
          + ", ".join(f"{name} {ms:.1f} ms" for name, ms in cpu.items()))  # fmt: skip
    result = {"environment": environment(), "n_mels": n_mels, "rows": rows, "feature_extractor_cpu_1_window_ms": cpu}
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
