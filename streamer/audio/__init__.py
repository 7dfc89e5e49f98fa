"""Audio in: container decoding and stream resampling, log-mel features, voice activity. Every
sample past the decoders is float32 mono at SAMPLE_RATE."""

SAMPLE_RATE = 16000
"""Whisper's input rate: every decoder and resampler of this package produces it."""
HOP_LENGTH = 160
"""Samples per log-mel frame (10 ms: 100 frames per second); here so that code without torch
(the gateways' long-form transcripts) can use it."""
