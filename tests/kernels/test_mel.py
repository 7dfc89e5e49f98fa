"""Log-mel: filterbank and reference against transformers, fused kernels against the reference.

The kernels run on CUDA when present, else through Triton's interpreter on 2 s of audio.
Bound 1e-4 absolute on the output ((log10 + 4) / 4 units), as for the feature extractor parity.
"""

from __future__ import annotations

import av
import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import mel_filter_bank

from cuda_ops.mel import HOP_LENGTH, log_mel, log_mel_from_stft, log_mel_reference, mel_filters

CUDA = torch.cuda.is_available()
WINDOW = 480_000  # 30 s at 16 kHz: what the encoder always sees


@pytest.fixture(scope="module")
def jfk(jfk_path) -> np.ndarray:
    """jfk.ogg decoded and resampled to 16 kHz mono float32 (11 s)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
    chunks = []
    with av.open(jfk_path) as container:
        for frame in container.decode(audio=0):
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    audio = np.concatenate(chunks).astype(np.float32)
    assert 10.5 < len(audio) / 16000 < 11.5
    return audio


def batch_of_three(jfk: np.ndarray, n: int) -> torch.Tensor:
    """Three examples of n samples with different peaks: speech, quieter speech, silence (all at the floor)."""
    return torch.from_numpy(np.stack([jfk[:n], 0.01 * jfk[3 * n // 2 : 5 * n // 2], np.zeros(n, np.float32)]))


def stft(audio: torch.Tensor) -> torch.Tensor:
    return torch.stft(audio, 400, 160, window=torch.hann_window(400, device=audio.device), return_complex=True)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_transformers(n_mels):
    expected = mel_filter_bank(
        num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0.0, max_frequency=8000.0,
        sampling_rate=16000, norm="slaney", mel_scale="slaney",
    )  # fmt: skip
    ours = mel_filters(n_mels)
    assert ours.shape == (n_mels, 201) and ours.dtype == torch.float32
    assert np.abs(ours.numpy() - expected.T).max() <= 1e-6


@pytest.mark.parametrize("n_mels", [80, 128])
def test_reference_matches_whisper_feature_extractor(jfk, n_mels):
    expected = WhisperFeatureExtractor(feature_size=n_mels)(jfk, sampling_rate=16000, return_tensors="np").input_features
    padded = np.zeros(WINDOW, np.float32)
    padded[: len(jfk)] = jfk
    ours = log_mel_reference(torch.from_numpy(padded)[None], n_mels)
    assert ours.shape == expected.shape == (1, n_mels, 3000)
    assert np.abs(ours.numpy() - expected).max() <= 1e-4


@pytest.mark.parametrize("n_mels", [80, 128])
def test_kernel_matches_reference(jfk, n_mels):
    """2 s (200 frames: 6 full tiles of 32 and a partial one), batch 3 with different per-example maxima."""
    audio = batch_of_three(jfk, 2 * 16000).to("cuda" if CUDA else "cpu")
    expected = log_mel_reference(audio, n_mels)
    out = log_mel_from_stft(stft(audio), mel_filters(n_mels).to(audio.device))
    assert out.shape == (3, n_mels, 2 * 16000 // HOP_LENGTH)
    assert torch.isfinite(out).all()
    assert (out - expected).abs().max().item() <= 1e-4
    assert (out[2] + 1.5).abs().max().item() <= 1e-6  # silence: log10(1e-10) = -10 -> (-10 + 4) / 4


def test_kernel_rejects_bad_inputs():
    spec = torch.zeros(1, 200, 5, dtype=torch.complex64, device="cuda" if CUDA else "cpu")
    with pytest.raises(ValueError, match="stft"):
        log_mel_from_stft(spec, mel_filters(80))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n_mels", [80, 128])
def test_cuda_full_windows(jfk, n_mels):
    """Batches of full 30-s windows through the dispatcher (torch.stft + kernels) on the GPU."""
    windows = np.zeros((5, WINDOW), np.float32)
    for i in range(5):
        piece = jfk[i * 8000 :] * (0.5**i)
        windows[i, : len(piece)] = piece
    audio = torch.from_numpy(windows).cuda()
    expected = log_mel_reference(audio, n_mels)
    out = log_mel(audio, n_mels)
    assert out.shape == (5, n_mels, 3000)
    assert torch.isfinite(out).all()
    assert (out - expected).abs().max().item() <= 1e-4
    cpu = log_mel_reference(audio.cpu(), n_mels)
    assert (out.cpu() - cpu).abs().max().item() <= 1e-4
