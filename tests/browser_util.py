"""Helpers for the browser tests: Debian's Chromium driven by Selenium, with a fake microphone
that plays a real recording, and polling of the page's `window.streamerState`.

Nothing is downloaded: Selenium is pointed at the system's chromium and chromedriver (`make test`
installs them). A missing browser fails the test: CI must not pass by skipping these.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import av
import numpy as np
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from streamer.audio.decode import decode_audio, write_wav

CHROMIUM = os.environ.get("STREAMER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("STREAMER_CHROMEDRIVER", "/usr/bin/chromedriver")
MIC_RATE = 48000
"""Rate of the fake microphone's WAV: Chromium's fake capture device runs at 48 kHz, so the file
is played without a conversion of its own."""
LEAD_S = 1.0
"""Silence before the first prompt: the page's first frames go out while the socket connects."""
GAP_S = 1.2
"""Silence between prompts: longer than the VAD's 0.5 s, so each prompt is its own utterance."""
TAIL_S = 4.0
"""Silence after the last prompt, so that the VAD ends (and the server finalises) it before the
test clicks Stop."""
SEVERE = "SEVERE"


def fake_mic_wav(clips: list[str], path: Path) -> float:
    """Write `clips` (audio files) joined by pauses, with silence before and after, as a 16-bit
    48 kHz mono WAV for `--use-file-for-fake-audio-capture`; returns its duration in seconds."""
    pause = lambda s: np.zeros(int(s * 16000), np.float32)  # noqa: E731
    parts = [pause(LEAD_S)]
    for clip in clips:
        parts += [decode_audio(clip), pause(GAP_S)]
    parts.append(pause(TAIL_S))
    audio16 = np.concatenate(parts)
    resampler = av.AudioResampler(format="flt", layout="mono", rate=MIC_RATE)
    frame = av.AudioFrame.from_ndarray(audio16[None, :], format="flt", layout="mono")
    frame.sample_rate = 16000
    audio48 = np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)])
    write_wav(path, audio48, MIC_RATE)
    return len(audio48) / MIC_RATE


def chromium(profile: Path, *, mic_wav: Path | None = None, size: tuple[int, int] = (1280, 900)) -> webdriver.Chrome:
    """A headless Chromium with a fresh profile; with `mic_wav`, its microphone plays that file
    once (`%noloop`: after the end it records silence) and permission prompts are granted."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            pytest.fail(f"{path} not found: install Debian's chromium and chromium-driver (`make browser`)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--autoplay-policy=no-user-gesture-required",
                 f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}"):
        options.add_argument(flag)
    if mic_wav is not None:
        options.add_argument("--use-fake-ui-for-media-stream")
        options.add_argument("--use-fake-device-for-media-stream")
        options.add_argument(f"--use-file-for-fake-audio-capture={mic_wav}%noloop")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def wait_for(what: str, check: Callable[[], Any], timeout: float, poll: float = 0.1) -> Any:
    """Poll `check()` until it returns something truthy, and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def page_state(driver: webdriver.Chrome) -> dict:
    """`window.streamerState` of the demo page (docs/protocol.md, section 5)."""
    return driver.execute_script("return window.streamerState")


def severe_console_errors(driver: webdriver.Chrome) -> list[str]:
    """Console messages at level SEVERE (uncaught exceptions, failed loads, console.error)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == SEVERE]
