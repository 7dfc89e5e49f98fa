"""Whisper's log-mel spectrogram, with the part after the STFT fused into one Triton pass.

Whisper's features: |STFT|^2 (n_fft 400, hop 160, periodic Hann, centred with reflect padding),
the last frame dropped, a Slaney mel filterbank, log10 clamped at 1e-10, then per example
max(x, max(x) - 8) and (x + 4) / 4. On the GPU, torch.stft (cuFFT) makes the complex spectrum and
two kernels do the rest: pass 1 computes power, mel matmul and log10 per tile of frames and writes
each tile's maximum; pass 2 reduces those maxima per example and applies the floor and scaling in
place. Design and tuning: docs/kernels-attention-mel.md.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from cuda_ops._triton import jit, tl, triton, triton_usable

SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms windows
HOP_LENGTH = 160  # 10 ms hop: 100 frames per second
N_FREQ = N_FFT // 2 + 1  # 201 one-sided frequency bins
LOG_FLOOR = 1e-10  # clamp before log10
DYNAMIC_RANGE = 8.0  # log10 units kept below each example's maximum (80 dB)

# Tuning, measured on an H200 at batch 16 and 64 of 30-s windows; docs/kernels-attention-mel.md has the numbers.
BLOCK_M = 128  # all mel bands in one tile (80 is padded): each spectrum tile is read once
BLOCK_F = 32  # frames per tile: 15% faster than 64 and 128 (more programs in flight per SM)
BLOCK_K = 16  # frequency bins per step (201 = 12 full steps + 1 masked); 32 was 15-20% slower
NUM_WARPS = 4  # 8 warps was 20% slower
# tf32x3 keeps fp32 accuracy (error ~1e-7 after log10) on the tensor cores; plain tf32 (2^-11
# relative) gave 2e-4, over the 1e-4 bound, and ieee (FMA units) was slower.
DOT_PRECISION = "tf32x3"


def mel_filters(n_mels: int, n_fft: int = N_FFT, sr: int = SAMPLE_RATE) -> torch.Tensor:
    """Slaney mel filterbank [n_mels, n_fft // 2 + 1] fp32, 0 Hz to sr / 2, Slaney area norm.

    Same filters as librosa's `filters.mel(norm="slaney")` and transformers' `mel_filter_bank(...,
    norm="slaney", mel_scale="slaney")`: triangles on the Slaney mel scale (linear below 1 kHz,
    logarithmic above), each scaled by 2 / its width in Hz. Computed in float64.
    """
    fft_freqs = np.linspace(0.0, sr // 2, n_fft // 2 + 1)
    mels = np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2), n_mels + 2)
    edges = _mel_to_hz(mels)  # lower edge, centre, upper edge of filter m at m, m + 1, m + 2
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (fft_freqs[None, :] - lower) / (centre - lower)
    falling = (upper - fft_freqs[None, :]) / (upper - centre)
    weights = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (upper - lower))
    return torch.from_numpy(weights.astype(np.float32))


_F_SP = 200.0 / 3  # Hz per mel in the linear part of the Slaney scale
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP  # 15
_LOGSTEP = np.log(6.4) / 27.0  # log-spaced part: 27 mels per factor 6.4 in Hz


def _hz_to_mel(hz):
    hz = np.asarray(hz, dtype=np.float64)
    return np.where(hz >= _MIN_LOG_HZ, _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP, hz / _F_SP)


def _mel_to_hz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL)), mel * _F_SP)


@functools.lru_cache(maxsize=8)
def _filters_on(n_mels: int, device: torch.device) -> torch.Tensor:
    """One copy of the filterbank per device: no host-to-device copy per call."""
    return mel_filters(n_mels).to(device)


def _stft(audio: torch.Tensor) -> torch.Tensor:
    """[B, N] fp32 -> complex [B, 201, N // 160 + 1], as Whisper computes it."""
    if audio.dim() != 2:
        raise ValueError(f"audio must be [B, N], got {tuple(audio.shape)}")
    window = torch.hann_window(N_FFT, device=audio.device)
    return torch.stft(audio.float(), N_FFT, HOP_LENGTH, window=window, center=True, return_complex=True)


def log_mel_reference(audio: torch.Tensor, n_mels: int) -> torch.Tensor:
    """Plain PyTorch log-mel: audio [B, N] fp32 at 16 kHz -> [B, n_mels, N // 160].

    Padding or trimming to 30 s (480000 samples, 3000 frames) is the caller's job.
    """
    power = _stft(audio)[..., :-1].abs() ** 2
    mel = _filters_on(n_mels, audio.device) @ power
    log_spec = torch.clamp(mel, min=LOG_FLOOR).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    return (torch.maximum(log_spec, peak - DYNAMIC_RANGE) + 4.0) / 4.0


def log_mel(audio: torch.Tensor, n_mels: int) -> torch.Tensor:
    """Log-mel of audio [B, N]: torch.stft + the fused kernels on CUDA, the reference on the CPU."""
    if audio.is_cuda and triton_usable(audio.device):
        return log_mel_from_stft(_stft(audio), _filters_on(n_mels, audio.device))
    return log_mel_reference(audio, n_mels)


def log_mel_from_stft(stft: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """The fused kernels: complex STFT [B, 201, F] + filters [n_mels, 201] -> log-mel [B, n_mels, F - 1].

    Runs on stft's device: CUDA, or the CPU under TRITON_INTERPRET=1.
    """
    if stft.dim() != 3 or stft.shape[1] != N_FREQ or stft.dtype != torch.complex64:
        raise ValueError(f"stft must be complex64 [B, {N_FREQ}, F], got {stft.dtype} {tuple(stft.shape)}")
    n_mels = filters.shape[0]
    if filters.shape != (n_mels, N_FREQ) or filters.dtype != torch.float32 or n_mels > BLOCK_M:
        raise ValueError(f"filters must be float32 [n_mels <= {BLOCK_M}, {N_FREQ}], got {filters.dtype} {tuple(filters.shape)}")
    if not triton_usable(stft.device):
        raise RuntimeError(f"Triton cannot run on {stft.device}; on the CPU set TRITON_INTERPRET=1 before import")
    B, _, F = stft.shape
    n_frames = F - 1
    spec = torch.view_as_real(stft)  # [B, 201, F, 2] fp32; strides in floats
    out = torch.empty(B, n_mels, n_frames, device=stft.device, dtype=torch.float32)
    n_tiles = triton.cdiv(n_frames, BLOCK_F)
    tile_max = torch.empty(B, n_tiles, device=stft.device, dtype=torch.float32)
    grid = (n_tiles, B)
    filters_t = filters.t().contiguous()  # [201, n_mels]: a tile's rows are contiguous mel runs
    _log_mel_kernel[grid](
        spec, filters_t, out, tile_max,
        n_frames, n_mels, n_tiles,
        spec.stride(0), spec.stride(1), spec.stride(2),
        filters_t.stride(0), out.stride(0), out.stride(1),
        N_FREQ=N_FREQ, BLOCK_M=BLOCK_M, BLOCK_F=BLOCK_F, BLOCK_K=BLOCK_K,
        DOT_PRECISION=DOT_PRECISION, num_warps=NUM_WARPS,
    )  # fmt: skip
    _normalize_kernel[grid](
        out, tile_max, n_frames, n_mels, n_tiles, out.stride(0), out.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_F=BLOCK_F, BLOCK_TILES=triton.next_power_of_2(n_tiles), num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


@jit
def _log_mel_kernel(
    spec_ptr, filt_t_ptr, out_ptr, tile_max_ptr,
    n_frames, n_mels, n_tiles,
    stride_sb, stride_sk, stride_st,
    stride_fk, stride_ob, stride_om,
    N_FREQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    b = tl.program_id(1)
    offs_t = tile * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_t = offs_t < n_frames  # frame n_frames (the last of the STFT) is dropped here
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_mels
    spec_base = spec_ptr + b.to(tl.int64) * stride_sb
    # Tiles are [frames, bins]: torch.stft stores each frame's bins contiguously, so a warp's
    # load spans a few frames' runs of bins instead of one sector per thread.
    acc = tl.zeros((BLOCK_F, BLOCK_M), tl.float32)  # mel^T = power^T [F, K] @ filters^T [K, M]
    for k0 in range(0, N_FREQ, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < N_FREQ
        ptrs = spec_base + offs_t[:, None] * stride_st + offs_k[None, :] * stride_sk
        mask = mask_t[:, None] & mask_k[None, :]
        re = tl.load(ptrs, mask=mask, other=0.0)
        im = tl.load(ptrs + 1, mask=mask, other=0.0)  # same sectors as re: no extra DRAM traffic
        power = re * re + im * im  # [BLOCK_F, BLOCK_K]
        w = tl.load(filt_t_ptr + offs_k[:, None] * stride_fk + offs_m[None, :], mask=mask_k[:, None] & mask_m[None, :], other=0.0)
        acc = tl.dot(power, w, acc, input_precision=DOT_PRECISION)
    log_spec = tl.log2(tl.maximum(acc, 1e-10)) * 0.30102999566398120  # log10(x) = log2(x) * log10(2)
    mask_out = mask_t[:, None] & mask_m[None, :]
    out_ptrs = out_ptr + b.to(tl.int64) * stride_ob + offs_m[None, :] * stride_om + offs_t[:, None]
    tl.store(out_ptrs, log_spec, mask=mask_out)
    tile_max = tl.max(tl.max(tl.where(mask_out, log_spec, float("-inf")), axis=1), axis=0)
    tl.store(tile_max_ptr + b * n_tiles + tile, tile_max)


@jit
def _normalize_kernel(
    out_ptr, tile_max_ptr, n_frames, n_mels, n_tiles, stride_ob, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_TILES: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    b = tl.program_id(1)
    # Each program re-reduces its example's tile maxima (94 floats for 30 s): cheaper than a
    # third launch, and deterministic, unlike a float atomic max.
    offs_i = tl.arange(0, BLOCK_TILES)
    maxima = tl.load(tile_max_ptr + b * n_tiles + offs_i, mask=offs_i < n_tiles, other=float("-inf"))
    floor = tl.max(maxima, axis=0) - 8.0  # DYNAMIC_RANGE
    offs_t = tile * BLOCK_F + tl.arange(0, BLOCK_F)
    offs_m = tl.arange(0, BLOCK_M)
    mask = (offs_m < n_mels)[:, None] & (offs_t < n_frames)[None, :]
    ptrs = out_ptr + b.to(tl.int64) * stride_ob + offs_m[:, None] * stride_om + offs_t[None, :]
    x = tl.load(ptrs, mask=mask, other=0.0)
    tl.store(ptrs, (tl.maximum(x, floor) + 4.0) / 4.0, mask=mask)
