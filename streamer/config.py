"""Typed settings for every layer, and the one place where environment variables map onto them.

Each dataclass is frozen: configuration flows down, nothing mutates it at run time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

LONG_FORM_MODES = ("fast", "accurate")
"""The file endpoints' long-form modes (`streamer/longform`, docs/longform.md)."""
ACCEPT_MODES = ("shared", "reuseport")
"""How gateway workers share the port (`ServerConfig.accept`)."""


@dataclass(frozen=True)
class ModelConfig:
    """Which Whisper to load and where to run it."""

    model: str = "tiny.en"
    """`tiny.en` (embedded, offline), `base` (the `[base]` extra), a local directory
    (CTranslate2 bundle or Hugging Face checkpoint) or a Hugging Face hub id."""
    device: str = "auto"
    """`auto` picks every visible CUDA GPU when there is one, else the CPU; `cuda` every visible
    GPU; `cuda:N` one; `cuda:0,cuda:1` a list. `streamer serve` runs one engine core per device."""
    dtype: str = "auto"
    """`auto` is float32 on the CPU and float16 on CUDA; `float16`, `bfloat16`, `float32`."""
    precision: str = "full_fp16"
    """Kernel preset on CUDA (`full_fp16`, `mixed_fp8`, `aggressive_fp8`); ignored on the CPU."""
    cpu_encoder: str = "auto"
    """The encoder's dtype on the CPU (`model/cpu_encoder.py`): `auto` is bfloat16 where the CPU
    multiplies bfloat16 natively (AMX, AVX512-BF16), else float32; `float32`; `bfloat16`."""


@dataclass(frozen=True)
class EngineConfig:
    """Continuous-batching limits. `None` sizes a limit from the device (VRAM budget or CPU)."""

    max_slots: int | None = None
    """Decoder slots (live sequences at once); each holds its self- and cross-attention K/V."""
    max_encoder_batch: int | None = None
    """Windows encoded together in one engine step."""
    max_queue: int = 4096
    """Queued windows beyond which `add()` refuses new work (HTTP 429 / stream error)."""
    encode_while_finals: int | None = None
    """Windows other than finals encoded per step while a final decodes (finals wait through
    fewer encoder passes; measured in docs/benchmarks.md, issue 14). None: 1 on a GPU (a pass is
    ~5 ms), 0 on the CPU (a pass is ~0.25 s: it would stall every decoding final that long)."""
    max_new_tokens: int = 224
    """Token limit per window: Whisper's context is 448 and half of it is for the prompt."""
    vram_limit_gb: float | None = None
    """Cap on this process's GPU memory; slots and encoder batches are sized to fit."""
    cuda_graphs: bool = True
    """Capture the decoder step as CUDA graphs per batch bucket (CUDA only)."""
    encoder_graphs: bool = True
    """With `cuda_graphs`: capture the encoder too, per batch size up to `max_encoder_batch` (one
    launch per pass instead of hundreds from the model thread; measured in docs/benchmarks.md)."""
    fill_files_first: bool = True
    """While only file chunks are live, steps that admit more of them decode nothing until the batch is
    full or the queue empty (`SchedulerConfig.fill_files_first`; off: every step decodes)."""
    overlap_encoder: bool = False
    """Encoder passes on a second CUDA stream (CUDA only): the live sequences' decode steps go on
    while a batch is encoded, and the batch joins them once its pass is done (one batch at a time).
    Measured in docs/benchmarks.md (issue 14): the live finals' latency with it and without."""
    decode_priority: bool = True
    """With `overlap_encoder`: decode steps on a CUDA stream of higher priority than the encoder's,
    so the encoder pass beside them yields SMs to their kernels (docs/benchmarks.md, issue 14)."""
    step_sms: int = 0
    """With `overlap_encoder` (CUDA only): while an encoder pass runs beside them, decode steps run
    on this many SMs and the encoder on the others (green contexts, `engine/partition.py`): on the
    same SMs the two stretch each other. 0: no partition. The encoder then always runs on the
    others; decode steps use a second set of CUDA graphs captured on the step's SMs, the usual set
    (every SM) when no pass runs (probe_green.py --split, session 18: 48 of 132 on the H200)."""
    async_steps: bool | None = None
    """While only file windows decode, launch each decode step before reading the previous one
    back, so that the host's work between steps runs beside the GPU's (`Runner.async_steps`;
    measured in docs/benchmarks.md, session 12). None: on with CUDA graphs."""


@dataclass(frozen=True)
class VADConfig:
    """silero-vad hysteresis for cutting utterances out of a live stream."""

    threshold: float = 0.5
    """Speech probability at which speech starts."""
    neg_threshold: float | None = None
    """Probability under which speech may end; default `threshold - 0.15`."""
    min_silence_ms: int = 500
    """Silence that must follow speech before the utterance ends."""
    speech_pad_ms: int = 200
    """Audio kept before the detected start and after the detected end."""
    min_speech_ms: int = 200
    """Shorter bursts are dropped as noise."""
    max_utterance_s: float = 28.0
    """Longer speech is cut at the quietest point of its last seconds (Whisper sees 30 s)."""


@dataclass(frozen=True)
class StreamingConfig:
    """Per-stream behaviour; a client's start message may override these."""

    vad: VADConfig = field(default_factory=VADConfig)
    partials: bool = True
    """Send provisional results while the person speaks."""
    partial_interval_s: float = 0.5
    """New speech between two partial submissions; also the narrowest wall-time cadence."""
    partial_interval_max_s: float = 4.0
    """The widest the gateway's partial cadence gets under load (`streaming/cadence.py`)."""
    final_budget_s: float | None = None
    """Finals' time in the engine (p90) above which partials thin out; None: 0.3 s on a GPU,
    0.6 s on the CPU (`cadence.budget_for`)."""
    language: str | None = None
    """None detects the language (multilingual models only)."""
    task: str = "transcribe"
    """`transcribe` or `translate` (to English)."""
    condition_on_previous: bool = False
    """Prompt each utterance with the previous finals' text (openai's `condition_on_previous_text`),
    under the rules of `streaming/session.py`: only finals that passed every check, at most
    `prompt_max_tokens`, dropped after a pause of `prompt_reset_pause_s`. Off by default: on the
    8-minute messy join (tiny.en) live WER was 5.85 % with it and 5.24 % without (offline `fast`
    4.84 %), on the shared 6-minute file 3.07 % either way (docs/benchmarks.md); without it a final
    also need not wait for the previous one."""
    prompt: str | None = None
    """Text that opens every utterance's prompt (names, spelling), also with conditioning off;
    OpenAI Realtime's `transcription.prompt`."""
    prompt_max_tokens: int = 128
    """The previous finals' text in a prompt is cut to its last this many tokens (Whisper takes 223)."""
    prompt_reset_pause_s: float = 10.0
    """After a pause this long between finals the previous text no longer prompts: a new topic or
    speaker, and an odd spelling carried on is the worse risk."""
    manual_commit: bool = False
    """The client cuts utterances (`Session.flush`), not the VAD: OpenAI Realtime's
    `turn_detection: null` (`audio/vad.py` `ManualSegmenter`)."""
    acoustic_context: bool = True
    """Decode each final inside the stream's preceding audio (back over the previous finals, to a
    pause of `acoustic_context_pause_s`, a window of 24 s at most), with those finals' tokens and
    timestamps forced as the decoder's prefix; only the new text is the final's. A 1-3 s utterance
    decoded alone loses words that the same audio inside a longer window keeps. On by default: live
    WER (tiny.en) 5.24 -> 4.84 % on messy-en-8-0, 3.23 -> 2.74 on messy-en-8-1, 4.59 -> 4.49 on the
    15-min join, 3.07 either way on the 6-min file; base es-5 19.2 -> 18.3, fr-5 14.3 either way,
    fr-10 15.3 -> 14.3, es-10 22.7 -> 23.4 (the one loss); about 3 % more engine time per final
    (docs/benchmarks.md, "Session 7: acoustic context"). A final then waits for the previous one,
    and a stream holds up to 30 s more audio (1.9 MB)."""
    acoustic_context_pause_s: float = 10.0
    """A pause at least this long between finals ends the acoustic context: older speech is
    another exchange, and the window would carry the silence."""
    continue_after_s: float = 1.0
    """A final whose decoded segments end more than this before its audio does, with VAD speech
    after them, is continued: the rest is decoded and joined to it (`streaming/continuation.py`;
    Whisper can end a long window early, leaving its last words out). Over the padding (0.2 s)
    and a last word's timestamp slack; 0 turns it off."""


@dataclass(frozen=True)
class ServerConfig:
    """The gateway."""

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int | None = None
    """Gateway worker processes on the port (each with its sockets, VAD and sessions), in front
    of one engine core process per device. None: 1 on a machine with at most 2 cores, else
    min(8, cores / 2). 0: one process holding the engine itself (no IPC; for comparison)."""
    accept: str = "shared"
    """How gateway workers share the port: `shared`, one listening socket from which a free
    gateway accepts (load follows capacity); `reuseport`, a socket each, connections hashed by
    the kernel (`server/supervisor.py`)."""
    api_key: str | None = None
    """When set, every request needs `Authorization: Bearer KEY` or `?api_key=KEY`."""
    max_sessions: int = 256
    """Concurrent live streams; more are refused politely."""
    idle_timeout_s: float = 60.0
    """A stream that sends nothing for this long is closed."""
    manual_idle_timeout_s: float = 1800.0
    """A Realtime session with `turn_detection: null` (push-to-talk: the client commits) is held
    this long without a client event, and without its first audio, in place of `idle_timeout_s`
    and `first_audio_timeout_s`: OpenAI's Realtime API has no keepalive event and the SDKs'
    WebSocket pings never reach the app, so a dictation user who thinks for a minute lost the
    session. 30 min: OpenAI's own session lifetime."""
    max_message_bytes: int = 1 << 20
    """Largest WebSocket message accepted."""
    max_upload_mb: float = 200.0
    """Largest file accepted by the file endpoints."""
    max_audio_s: float = 4 * 3600.0
    """Longest recording accepted by the file endpoints."""
    upload_audio_budget_s: float | None = None
    """Seconds of decoded upload audio (every channel counted) a gateway worker holds at once, from
    an upload's decode to the end of its transcription (float32: 0.23 GB an hour, a 4-h upload about
    2 GB at its peak); an upload that would pass it is refused with a 429 and `Retry-After`, one over
    the whole budget with a 413 (`server/upload_budget.py`). None: 3 x `max_audio_s`; at least
    `max_audio_s`, so that any mono upload under the limits can be served alone."""
    mode: str = "fast"
    """Default long-form mode of the file endpoints: `fast` or `accurate`."""
    shutdown_grace_s: float = 10.0
    """On shutdown, time given to open streams to receive their finals."""
    finish_timeout_s: float = 60.0
    """A stream that ends (or a Realtime segmentation that a `session.update` retires) waits this
    long for its finals still in the engine; what is not back by then is given up."""
    max_backlog_s: float = 10.0
    """A live stream's socket is not read while this much of its audio past the end of its
    oldest undelivered final is waiting (TCP then slows the sender). 0: no limit."""
    vad_batch_ms: float = 10.0
    """Live audio waits up to this long (or until 64 streams have some) to have its VAD scored
    in one call with the other streams' of the gateway: half the VAD's CPU a frame
    (`server/vad_batcher.py`), at most this much later to cut an utterance. 0: each chunk alone."""
    max_loop_lag_s: float = 1.0
    """New live streams are refused (`overloaded`) while the event loop runs this late: the
    gateway is past what one process can serve, and the streams it has would suffer. 0: no limit."""
    # Hardening (docs/security.md).
    allowed_origins: str = ""
    """Comma-separated origins (`https://app.example`) whose pages may open streams and call the
    API; the server's own origin is always allowed, `*` allows any. Requests without `Origin`
    (SDKs, pipelines) are not affected."""
    max_outbox_bytes: int = 4 << 20
    """Events queued for a client that does not read; past this the connection is closed."""
    send_timeout_s: float = 20.0
    """A client that takes no event for this long (its socket stays full) is closed."""
    max_connections_per_client: int = 64
    """Live streams one client address may hold at once (0: no limit)."""
    first_audio_timeout_s: float = 15.0
    """A stream that has sent no audio this long after it opened is closed (pings do not count;
    Deepgram's `KeepAlive` does, as there)."""
    upload_decoders: int = 0
    """Child processes per gateway worker that decode uploads (a file that crashes the decoder kills
    one of them, not the gateway: `server/decoder.py`); 0: as many as cores, up to 4."""
    upload_spool_dir: str | None = None
    """Where an upload's decoded samples wait between its decoder process and the gateway (2 bytes a
    sample: 0.46 GB for 4 hours, removed at once); None: the system's temporary directory (`TMPDIR`).
    Point it at a disk, not a small tmpfs, and at one directory per host or container: a gateway's
    start removes the files of gateway pids that no longer exist there (killed ones left them;
    `server/decoder.py`)."""
    upload_idle_timeout_s: float = 30.0
    """An upload whose body stalls this long is refused (408) and its temporary file removed."""
    sse_keepalive_s: float = 15.0
    """A streamed file response (`stream=true`) with no event for this long gets an SSE comment
    line, which clients ignore: `accurate`'s first voted text can come a minute of audio or more
    into the recording, and proxies close responses that stay silent (often after 60 s)."""
    ssl_certfile: str | None = None
    """PEM certificate (chain): serve HTTPS and WSS (the SDKs' realtime clients use TLS)."""
    ssl_keyfile: str | None = None
    resume_s: float = 30.0
    """A `/v1/stream` session whose connection drops is kept this long for the client to resume."""
    resume_events: int = 4096
    """Events of a `/v1/stream` session kept for a resume's replay (a minute of speech makes a few
    hundred): its memory while parked is bounded by this."""
    worker_id: int = 0
    """This gateway process among several on one port; resume tokens name it (`docs/protocol.md`)."""
    peer_dir: str | None = None
    """The supervisor's run directory, where each gateway worker also serves on a private Unix
    socket: a resume or a Twilio subscriber that lands on another worker is relayed to the one
    holding the session (`server/relay.py`). Set by `streamer serve`; None: a gateway alone."""
    webrtc_ice_servers: str = ""
    """STUN/TURN servers for WebRTC clients: a JSON list in `RTCPeerConnection`'s `iceServers`
    format, served at `/v1/webrtc/config` (`docs/protocol.md`); empty: none."""


@dataclass(frozen=True)
class Settings:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    server: ServerConfig = field(default_factory=ServerConfig)


# Environment variable -> (section, field). The only place env vars are read.
ENV_VARS: dict[str, tuple[str, str]] = {
    "MODEL_ID": ("model", "model"),
    "DEVICE": ("model", "device"),
    "DTYPE": ("model", "dtype"),
    "PRECISION": ("model", "precision"),
    "CPU_ENCODER": ("model", "cpu_encoder"),
    "MAX_SLOTS": ("engine", "max_slots"),
    "MAX_ENCODER_BATCH": ("engine", "max_encoder_batch"),
    "MAX_QUEUE": ("engine", "max_queue"),
    "ENCODE_WHILE_FINALS": ("engine", "encode_while_finals"),
    "VRAM_LIMIT_GB": ("engine", "vram_limit_gb"),
    "CUDA_GRAPHS": ("engine", "cuda_graphs"),
    "ENCODER_GRAPHS": ("engine", "encoder_graphs"),
    "OVERLAP_ENCODER": ("engine", "overlap_encoder"),
    "FILL_FILES_FIRST": ("engine", "fill_files_first"),
    "DECODE_PRIORITY": ("engine", "decode_priority"),
    "STEP_SMS": ("engine", "step_sms"),
    "ASYNC_STEPS": ("engine", "async_steps"),
    "PARTIAL_INTERVAL_S": ("streaming", "partial_interval_s"),
    "PARTIAL_INTERVAL_MAX_S": ("streaming", "partial_interval_max_s"),
    "FINAL_BUDGET_S": ("streaming", "final_budget_s"),
    "ACOUSTIC_CONTEXT": ("streaming", "acoustic_context"),
    "CONTINUE_AFTER_S": ("streaming", "continue_after_s"),
    "HOST": ("server", "host"),
    "WORKERS": ("server", "workers"),
    "GATEWAY_ACCEPT": ("server", "accept"),
    "PORT": ("server", "port"),
    "API_KEY": ("server", "api_key"),
    "MAX_SESSIONS": ("server", "max_sessions"),
    "IDLE_TIMEOUT_S": ("server", "idle_timeout_s"),
    "MANUAL_IDLE_TIMEOUT_S": ("server", "manual_idle_timeout_s"),
    "MAX_UPLOAD_MB": ("server", "max_upload_mb"),
    "MAX_AUDIO_S": ("server", "max_audio_s"),
    "UPLOAD_AUDIO_BUDGET_S": ("server", "upload_audio_budget_s"),
    "MODE": ("server", "mode"),
    "MAX_LOOP_LAG_S": ("server", "max_loop_lag_s"),
    "MAX_BACKLOG_S": ("server", "max_backlog_s"),
    "VAD_BATCH_MS": ("server", "vad_batch_ms"),
    "SHUTDOWN_GRACE_S": ("server", "shutdown_grace_s"),
    "FINISH_TIMEOUT_S": ("server", "finish_timeout_s"),
    "ALLOWED_ORIGINS": ("server", "allowed_origins"),
    "MAX_OUTBOX_BYTES": ("server", "max_outbox_bytes"),
    "SEND_TIMEOUT_S": ("server", "send_timeout_s"),
    "MAX_CONNECTIONS_PER_CLIENT": ("server", "max_connections_per_client"),
    "FIRST_AUDIO_TIMEOUT_S": ("server", "first_audio_timeout_s"),
    "UPLOAD_IDLE_TIMEOUT_S": ("server", "upload_idle_timeout_s"),
    "SSE_KEEPALIVE_S": ("server", "sse_keepalive_s"),
    "SSL_CERTFILE": ("server", "ssl_certfile"),
    "SSL_KEYFILE": ("server", "ssl_keyfile"),
    "RESUME_S": ("server", "resume_s"),
    "RESUME_EVENTS": ("server", "resume_events"),
    "UPLOAD_DECODERS": ("server", "upload_decoders"),
    "UPLOAD_SPOOL_DIR": ("server", "upload_spool_dir"),
    "STREAMER_WORKER_ID": ("server", "worker_id"),
    "WEBRTC_ICE_SERVERS": ("server", "webrtc_ice_servers"),
}


def log_level(default: str, env: Mapping[str, str] | None = None) -> str:
    """`LOG_LEVEL` of the streamer loggers, else `default` (each process kind has its own: the
    server logs INFO, `streamer transcribe` WARNING, so that stderr stays quiet in pipes)."""
    return (os.environ if env is None else env).get("LOG_LEVEL", default)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _field_types(settings: Settings) -> dict[tuple[str, str], str]:
    """(section, field) -> the field's annotation as text ("int | None", "bool", ...)."""
    return {(section.name, f.name): str(f.type) for section in dataclasses.fields(settings)
            for f in dataclasses.fields(getattr(settings, section.name))}


def _coerce(value: str, kind: str) -> Any:
    if value == "" and "None" in kind:
        return None
    if kind.startswith("bool"):
        text = value.strip().lower()
        if text not in _TRUE + _FALSE:
            raise ValueError(f"must be one of {', '.join(_TRUE + _FALSE)}")
        return text in _TRUE
    if kind.startswith("int"):
        return int(value)
    if kind.startswith("float"):
        return float(value)
    return value


def load_settings(env: Mapping[str, str] | None = None, **overrides: Mapping[str, Any]) -> Settings:
    """Defaults, then environment variables, then explicit overrides (CLI flags) per section.

    `load_settings(server={"port": 9000})` overrides one field; `None` values are ignored so
    that unset CLI flags fall through to the environment.
    """
    env = os.environ if env is None else env
    settings = Settings()
    sections: dict[str, dict[str, Any]] = {name: {} for name in ("model", "engine", "streaming", "server")}
    kinds = _field_types(settings)
    for var, (section, name) in ENV_VARS.items():
        if var in env:
            try:
                sections[section][name] = _coerce(env[var], kinds[section, name])
            except ValueError as e:
                raise ValueError(f"environment variable {var}={env[var]!r}: {e}") from None
    for section, values in overrides.items():
        sections[section].update({k: v for k, v in values.items() if v is not None})
    settings = Settings(**{s: dataclasses.replace(getattr(settings, s), **v) for s, v in sections.items()})
    check_settings(settings)
    return settings


# (section, field) -> (low, high, low excluded): the range of every numeric setting. An int field
# must hold an int, every value must be finite; None fields (sized from the device) may be None.
RANGES: dict[tuple[str, str], tuple[float | None, float | None, bool]] = {
    ("engine", "max_slots"): (1, None, False),
    ("engine", "max_encoder_batch"): (1, None, False),
    ("engine", "max_queue"): (1, None, False),
    ("engine", "encode_while_finals"): (0, None, False),
    ("engine", "max_new_tokens"): (1, 448, False),
    ("engine", "vram_limit_gb"): (0, None, True),
    ("engine", "step_sms"): (0, None, False),
    ("streaming", "partial_interval_s"): (0, None, True),
    ("streaming", "partial_interval_max_s"): (0, None, True),
    ("streaming", "final_budget_s"): (0, None, True),
    ("streaming", "prompt_max_tokens"): (0, 223, False),
    ("streaming", "prompt_reset_pause_s"): (0, None, True),
    ("streaming", "acoustic_context_pause_s"): (0, None, True),
    ("streaming", "continue_after_s"): (0, None, False),
    ("server", "port"): (0, 65535, False),
    ("server", "workers"): (0, 256, False),
    ("server", "max_sessions"): (1, None, False),
    ("server", "idle_timeout_s"): (0, None, True),
    ("server", "manual_idle_timeout_s"): (0, None, True),
    ("server", "max_message_bytes"): (1024, None, False),
    ("server", "max_upload_mb"): (0, None, True),
    ("server", "max_audio_s"): (0, None, True),
    ("server", "upload_audio_budget_s"): (0, None, True),
    ("server", "shutdown_grace_s"): (0, None, False),
    ("server", "finish_timeout_s"): (0, None, True),
    ("server", "max_backlog_s"): (0, None, False),
    ("server", "vad_batch_ms"): (0, 1000, False),
    ("server", "max_loop_lag_s"): (0, None, False),
    ("server", "max_outbox_bytes"): (1024, None, False),
    ("server", "send_timeout_s"): (0, None, True),
    ("server", "max_connections_per_client"): (0, None, False),
    ("server", "first_audio_timeout_s"): (0, None, True),
    ("server", "upload_decoders"): (0, 64, False),
    ("server", "upload_idle_timeout_s"): (0, None, True),
    ("server", "sse_keepalive_s"): (0, None, True),
    ("server", "resume_s"): (0, None, False),
    ("server", "resume_events"): (1, None, False),
    ("server", "worker_id"): (0, None, False),
}
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("model", "dtype"): ("auto", "float16", "bfloat16", "float32"),
    ("model", "cpu_encoder"): ("auto", "float32", "bfloat16"),
    ("streaming", "task"): ("transcribe", "translate"),
    ("server", "accept"): ACCEPT_MODES,
    ("server", "mode"): LONG_FORM_MODES,
}
_DEVICE = re.compile(r"(auto|cpu|cuda(:\d+)?)$")
_ONE_DEVICE = re.compile(r"(cpu|cuda:\d+)$")


def parse_ice_servers(raw: str) -> list[dict]:
    """`ServerConfig.webrtc_ice_servers` (env `WEBRTC_ICE_SERVERS`): a JSON list in
    `RTCPeerConnection`'s `iceServers` format; [] if empty."""
    if not raw.strip():
        return []
    try:
        servers = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"WEBRTC_ICE_SERVERS is not valid JSON: {e}") from None
    if not isinstance(servers, list) or not all(isinstance(s, dict) and "urls" in s for s in servers):
        raise ValueError("WEBRTC_ICE_SERVERS must be a JSON list of objects with `urls`")
    return servers


def setting_name(section: str, name: str) -> str:
    """How a user sets a field: its environment variable, else `section.field`."""
    return next((var for var, key in ENV_VARS.items() if key == (section, name)), f"{section}.{name}")


def check_settings(settings: Settings) -> None:
    """Ranges and choices of the settings (ValueError naming the variable): a bad value stops
    `streamer serve` at once with one line, instead of crash-looping a child process or being
    accepted and breaking every request."""
    from streamer.protocols import validation as v  # plain Python: no torch, no server

    kinds = _field_types(settings)
    for (section, name), (low, high, open_low) in RANGES.items():
        value = getattr(getattr(settings, section), name)
        if value is not None:
            v.number(value, setting_name(section, name), low, high, open_low=open_low,
                     integer=kinds[section, name].startswith("int"))
    for (section, name), choices in CHOICES.items():
        v.choice(getattr(getattr(settings, section), name), setting_name(section, name), choices)
    device = settings.model.device
    parts = [d.strip() for d in device.split(",")]
    if not (_DEVICE.match(device) or (len(parts) > 1 and all(_ONE_DEVICE.match(d) for d in parts))):
        raise v.ValidationError("DEVICE", f"must be auto, cpu, cuda, cuda:N or a list (cuda:0,cuda:1), not {device!r}")
    if not settings.model.model.strip():
        raise v.ValidationError("MODEL_ID", "must name a model")
    from cuda_ops.precision import get_preset  # dataclasses only

    try:
        get_preset(settings.model.precision)
    except ValueError as e:
        raise v.ValidationError("PRECISION", str(e)) from None
    streaming = settings.streaming
    if streaming.partial_interval_max_s < streaming.partial_interval_s:
        raise v.ValidationError("PARTIAL_INTERVAL_MAX_S", f"{streaming.partial_interval_max_s:g} is below "
                                f"PARTIAL_INTERVAL_S ({streaming.partial_interval_s:g})")
    server = settings.server
    if server.upload_audio_budget_s is not None and server.upload_audio_budget_s < server.max_audio_s:
        raise v.ValidationError("UPLOAD_AUDIO_BUDGET_S", f"{server.upload_audio_budget_s:g} is below MAX_AUDIO_S "
                                f"({server.max_audio_s:g}): an upload at the duration limit could never be served")
    if server.upload_spool_dir is not None and not os.path.isdir(server.upload_spool_dir):
        raise v.ValidationError("UPLOAD_SPOOL_DIR", f"{server.upload_spool_dir!r} is not a directory")
    if bool(server.ssl_certfile) != bool(server.ssl_keyfile):
        raise v.ValidationError("SSL_KEYFILE" if server.ssl_certfile else "SSL_CERTFILE",
                                "SSL_CERTFILE and SSL_KEYFILE go together")
    parse_ice_servers(server.webrtc_ice_servers)


@functools.cache  # asked on every connection and request; the served model's name is fixed per process
def model_id(name: str) -> str:
    """The id a served model goes by on every API (`/v1/models`, the file API, Realtime sessions,
    `/v1/stream`'s `ready`, Deepgram's metadata, `/health`): a local checkpoint's directory name, not
    its path (which tells clients where the server keeps its files); any other name as it is."""
    path = Path(name).expanduser()
    return path.name if path.name and path.is_dir() else name
