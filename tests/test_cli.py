"""`streamer transcribe` and `streamer serve` as a user runs them: a real process, real files, stdout/stderr
separated, one line for a mistake."""

from __future__ import annotations

import json
import os
import re
import subprocess
import socket
import sys
import time

import numpy as np
import pytest
import torch

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


def test_several_files_stay_apart_in_every_format(jfk_path, tmp_path):
    """Several files: JSON one object a line naming its file, subtitles under headers, or one file each
    with --output-dir (concatenated JSON objects and restarting cue numbers could not be split)."""
    write_wav(tmp_path / "short.wav", decode_audio(jfk_path)[: 3 * 16000])
    files = [jfk_path, str(tmp_path / "short.wav")]
    out = run("transcribe", *files, "--format", "verbose_json", "--quiet")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [o["file"] for o in lines] == files and "fellow americans" in lines[0]["text"].lower()
    assert lines[0]["segments"] and lines[0]["duration"] == pytest.approx(11.0, abs=0.1)
    out = run("transcribe", *files, "--format", "srt", "--quiet")
    assert out.returncode == 0 and [line for line in out.stdout.splitlines() if line.startswith("==> ")] == \
        [f"==> {f} <==" for f in files]
    out = run("transcribe", *files, "--format", "vtt", "--quiet", "--output-dir", str(tmp_path))
    assert out.returncode == 0 and out.stdout == "", out.stderr
    for stem in ("jfk", "short"):
        assert (tmp_path / f"{stem}.vtt").read_text().startswith("WEBVTT")
    assert "fellow" in (tmp_path / "jfk.vtt").read_text().lower()


def test_option_mistakes_are_refused_before_any_work(jfk_path, tmp_path):
    """Options the API refuses are refused here too: words without verbose_json, a language the
    English-only model cannot decode (it used to print English and exit 0)."""
    out = run("transcribe", jfk_path, "--format", "json", "--word-timestamps")
    assert out.returncode == 2 and "verbose_json" in out.stderr
    out = run("transcribe", jfk_path, "--language", "de")
    assert out.returncode == 2 and "English-only" in out.stderr and out.stdout == ""
    out = run("transcribe", jfk_path, jfk_path, "--output-dir", str(tmp_path))
    assert out.returncode == 2 and "same name" in out.stderr


def test_serve_with_a_bad_setting_says_so_in_one_line():
    out = subprocess.run([sys.executable, "-m", "streamer.cli", "serve", "--port", "0"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "MAX_QUEUE": "-1"})
    assert out.returncode == 2
    assert out.stderr.strip() == "streamer: MAX_QUEUE: -1 is outside 1 <= x"


def test_serve_stops_when_the_model_does_not_load_instead_of_restarting_it_forever(tmp_path):
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "streamer.cli", "serve", "--port", "0"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "MODEL_ID": str(tmp_path / "missing")})
    assert out.returncode == 1, out.stderr
    assert "no such directory" in out.stderr and "before it was ready" in out.stderr
    assert "restarting" not in out.stderr
    assert time.monotonic() - t0 < 60


def test_serve_on_a_port_in_use_or_a_missing_gpu_says_so_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "streamer.cli", "serve", "--port", str(port)], capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("streamer: cannot serve: ") and "Traceback" not in out.stderr, out.stderr
    if not torch.cuda.is_available():
        out = subprocess.run([sys.executable, "-m", "streamer.cli", "serve", "--port", "0"], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "DEVICE": "cuda"})
        assert out.returncode == 2 and "no CUDA GPU" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_python_dash_m_streamer_is_the_streamer_command():
    """`python -m streamer serve` (how many run a package's command from a checkout or a virtualenv
    without its scripts on PATH) failed: "No module named streamer.__main__" (QA session 31)."""
    out = subprocess.run([sys.executable, "-m", "streamer", "serve", "--port", "0"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "MAX_QUEUE": "-1"})
    assert out.returncode == 2 and out.stderr.strip() == "streamer: MAX_QUEUE: -1 is outside 1 <= x", out.stderr
