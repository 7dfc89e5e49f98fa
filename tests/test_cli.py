"""`streamer transcribe` as a user runs it: a real process, real files, stdout/stderr separated."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from streamer.audio.decode import decode_audio, write_wav


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "streamer.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_transcribes_files_together_and_keeps_stdout_clean(jfk_path, manifest, tmp_path):
    prompt = next(r for r in manifest if r["audio"].endswith("agent-newlocation.ogg"))
    # A ~40-s file of different recordings with pauses: long-form windows and a progress bar (stderr).
    others = [r for r in manifest if r["language"] == "en" and "asterisk/" in r["audio"] and 4 < r["duration"] < 12][:3]
    pause = np.zeros(16000, np.float32)
    parts = [decode_audio(jfk_path)] + [decode_audio(r["audio"]) for r in others]
    write_wav(tmp_path / "long.wav", np.concatenate([x for p in parts for x in (p, pause)]))
    out = run("transcribe", jfk_path, prompt["audio"], str(tmp_path / "long.wav"))
    assert out.returncode == 0, out.stderr
    text = out.stdout.lower()
    assert "ask not what your country can do for you" in text
    assert "please enter a new extension" in text
    assert text.count("fellow americans") == 2  # the short file and the long one
    assert "%" in out.stderr and "%" not in out.stdout  # progress goes to stderr


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitle_formats_have_increasing_times(jfk_path, fmt):
    out = run("transcribe", jfk_path, "--format", fmt)
    assert out.returncode == 0, out.stderr
    stamps = re.findall(r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)", out.stdout)
    assert stamps
    times = [(int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000) for st in stamps for h, m, s, ms in (st[:4], st[4:])]
    assert times == sorted(times)
    assert out.stdout.startswith("WEBVTT") if fmt == "vtt" else out.stdout.startswith("1\n")


def test_bad_input_is_one_clear_line(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("not audio at all")
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    out = run("transcribe", str(bad), str(empty))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "notes.txt:" in out.stderr and "empty.wav:" in out.stderr
    assert out.stdout == ""


def test_unknown_model_and_translation_on_english_only(jfk_path):
    out = run("transcribe", jfk_path, "--model", "no-such-model")
    assert out.returncode == 2 and "no-such-model" in out.stderr and "Traceback" not in out.stderr
    out = run("transcribe", jfk_path, "--task", "translate")
    assert out.returncode == 2 and "English-only" in out.stderr
