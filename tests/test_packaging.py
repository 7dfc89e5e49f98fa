"""The package as users get it: a wheel built from this tree, installed into a fresh virtual
environment and run from outside the checkout. Offline: the wheel is built without build isolation
and installed with `--no-index --no-deps` into a venv that sees this interpreter's packages (the
dependencies), so nothing is fetched."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp / "dist"), str(ROOT)], check=True, capture_output=True)
    [wheel] = (tmp / "dist").glob("streamer-*.whl")
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env)], check=True)
    # --force-reinstall: this interpreter may hold the same version as an editable install.
    subprocess.run([env / "bin" / "python", "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall",
                    "-q", str(wheel)], check=True, capture_output=True)
    return env


def run(venv: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """A command of the venv, in a directory outside the checkout and without PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=venv.parent, env=env, text=True,
                          capture_output=True, **kw)


def test_the_installed_package_is_the_wheel_with_its_web_page(venv):
    out = run(venv, "python", "-c", "import json, streamer, streamer.server.app as a; print(streamer.__file__); "
                                    "print(json.dumps([p.name for p in a.WEB_DIR.iterdir()]))", check=True).stdout
    where, files = out.splitlines()
    assert Path(where).is_relative_to(venv), where  # not this checkout
    assert {"index.html", "app.js", "subtitles.js", "style.css"} <= set(json.loads(files))


def test_cli_and_loadtest_help(venv):
    top = run(venv, "streamer", "--help", check=True).stdout
    assert all(word in top for word in ("serve", "transcribe", "loadtest"))
    load = run(venv, "streamer", "loadtest", "--help", check=True).stdout
    assert "--audio-dir" in load and "--spawn" in load and load.startswith("usage: streamer loadtest")


def test_installed_server_serves_the_web_page(venv):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen([str(venv / "bin" / "streamer"), "serve", "--port", str(port), "--workers", "0",
                               "--device", "cpu"], cwd=venv.parent, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(480):
            if server.poll() is not None:
                pytest.fail(f"streamer serve exited: {server.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.25)
        with urllib.request.urlopen(url + "/", timeout=10) as r:
            page = r.read().decode()
        with urllib.request.urlopen(url + "/subtitles.js", timeout=10) as r:
            script = r.read().decode()
        assert "<html" in page.lower() and "app.js" in page
        assert "export function toVtt" in script
    finally:
        server.terminate()
        server.wait(60)
