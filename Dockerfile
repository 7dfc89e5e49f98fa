# GPU image: CUDA runtime + the CUDA build of torch + streamer; `streamer serve` on port 8000.
# Build: docker build -t streamer .   Run: docker run --gpus all -p 8000:8000 -e MODEL_ID=openai/whisper-large-v3-turbo streamer
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    HOST=0.0.0.0 PORT=8000 HF_HOME=/data/hf
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first (on Linux x86-64 the default torch wheel is a CUDA build; pass TORCH_SPEC to pin
# another), so that streamer's `torch>=2.11` is already satisfied.
ARG TORCH_SPEC="torch>=2.11"
RUN pip install "$TORCH_SPEC" "triton>=3.2"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY streamer ./streamer
COPY cuda_ops ./cuda_ops
COPY web ./web
RUN pip install -e ".[base]"

EXPOSE 8000
VOLUME /data/hf
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s CMD python3 -c "import os,urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\",\"8000\")}/health')"
ENTRYPOINT ["streamer", "serve"]
