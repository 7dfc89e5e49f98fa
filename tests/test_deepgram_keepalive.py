"""Deepgram's `KeepAlive` before the first audio, with the official `deepgram-sdk` (QA session 31b).

Deepgram keeps a live stream open on KeepAlive alone ("If no audio data or KeepAlive messages are
sent within a 10-second window, the connection will close"): voice agents open the stream ahead
of the caller's first words, or while their own greeting plays, and send KeepAlive until audio
comes. Here `first_audio_timeout_s` closed such a stream (`Metadata`, close 1000) before any
audio came.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from streamer.audio.decode import decode_audio
from streamer.config import load_settings
from streamer.server.app import create_app, running

KEY = "keepalive-test-key"
RATE = 16000
FIRST_AUDIO_S = 1.0


def test_keepalive_holds_a_deepgram_stream_open_until_its_audio_comes(engine, jfk_path):
    from deepgram import DeepgramClient
    from deepgram.environment import DeepgramClientEnvironment
    from deepgram.extensions.types.sockets import ListenV1ControlMessage

    speech = decode_audio(jfk_path)[: int(3.2 * RATE)]  # "And so my fellow Americans"
    audio = (np.clip(np.concatenate([speech, np.zeros(RATE, np.float32)]), -1, 1) * 32767).astype("<i2").tobytes()
    settings = load_settings({}, server={"api_key": KEY, "first_audio_timeout_s": FIRST_AUDIO_S})
    received: list = []
    with running(create_app(settings, engine)) as base:
        ws = base.replace("http://", "ws://")
        client = DeepgramClient(api_key=KEY, environment=DeepgramClientEnvironment(base=base, production=ws, agent=ws))
        with client.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate="16000") as conn:
            reader = threading.Thread(target=lambda: received.extend(conn), daemon=True)
            reader.start()
            for _ in range(int(3 * FIRST_AUDIO_S / 0.25)):  # three times the timeout, audio-less
                conn.send_control(ListenV1ControlMessage(type="KeepAlive"))
                time.sleep(0.25)
            assert reader.is_alive(), [m.type for m in received]  # still open
            for i in range(0, len(audio), 6400):
                conn.send_media(audio[i:i + 6400])
            conn.send_control(ListenV1ControlMessage(type="CloseStream"))
            reader.join(60)
    kinds = [m.type for m in received]
    assert kinds[-1] == "Metadata", kinds
    finals = [m for m in received if m.type == "Results" and m.is_final]
    assert finals and "fellow" in finals[0].channel.alternatives[0].transcript.lower(), received
    assert received[-1].duration == 4.2
