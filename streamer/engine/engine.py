"""The engine's async face: many callers submit windows, one model thread runs the steps.

Each step is "schedule, execute, update" (vLLM v1's loop): the scheduler picks windows and live
sequences, the runner executes them on the model, the scheduler learns what finished. The model
thread never touches the event loop except through `call_soon_threadsafe`; callers never touch the
model. `add()` runs in the caller's thread under a lock, so a full queue is refused at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator

import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

from streamer.config import EngineConfig, ModelConfig
from streamer.engine.request import MAX_WINDOW_SAMPLES, SAMPLE_RATE, DecodeOptions, Priority, Request, RequestState, Result
from streamer.engine.beam import MAX_BEAM
from streamer.engine.runner import SDPA_BACKENDS, Runner, Sequence
from streamer.engine.scheduler import QueueFull, Scheduler, SchedulerConfig, StepOutput
from streamer.model.decoding import best_attempt, compression_ratio, judge, split_segments
from streamer.model.weights import LoadedModel, load_model
from streamer.model.whisper import KVCache
from streamer.types import Segment

log = logging.getLogger("streamer.engine")

WARMUP_MAX_STEPS = 32
"""Decoder steps a warm-up window of silence may take (it usually ends at once)."""

# How long a caller is willing to wait for admission, by class: the scheduler orders by deadline.
ADMISSION_DEADLINE_S = {Priority.FINAL: 0.0, Priority.PARTIAL: 0.2, Priority.FILE: 5.0}

__all__ = ["Engine", "Handle", "EngineClosed", "Cancelled", "QueueFull", "resolve_device"]


class EngineClosed(RuntimeError):
    """The engine is shutting down and takes no new work."""


class Cancelled(Exception):
    """The request was cancelled, replaced by a newer partial, or preempted by a final."""


def resolve_device(config: ModelConfig) -> tuple[torch.device, torch.dtype]:
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("DEVICE=cuda but torch sees no CUDA GPU (is the CUDA build of torch installed?)")
    names = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    if config.dtype == "auto":
        dtype = torch.float16 if device.type == "cuda" else torch.float32
    elif config.dtype in names:
        dtype = names[config.dtype]
    else:
        raise ValueError(f"dtype {config.dtype!r}: use auto, float16, bfloat16 or float32")
    return device, dtype


class Handle:
    """A submitted window: await its result, iterate its tokens, or cancel it."""

    def __init__(self, engine: "Engine", request: Request, loop: asyncio.AbstractEventLoop, stream_tokens: bool):
        self.engine = engine
        self.request = request
        self.id = request.id
        self.future: asyncio.Future[Result] = loop.create_future()
        self.submitted = time.monotonic()
        self._tokens: asyncio.Queue | None = asyncio.Queue() if stream_tokens else None
        self.attempts: list[Result] = []
        """Results of the attempts that failed the fallback checks (engine thread only)."""

    async def result(self) -> Result:
        return await asyncio.shield(self.future)

    async def tokens(self) -> AsyncIterator[int]:
        """Token ids as they are sampled (the current attempt's), ending with the result."""
        if self._tokens is None:
            raise RuntimeError("submit(..., stream_tokens=True) to iterate tokens")
        while True:
            token = await self._tokens.get()
            if token is None:
                return
            yield token

    def cancel(self) -> None:
        self.engine.cancel(self)

    def __await__(self):
        return self.result().__await__()


@dataclass
class EngineMetrics:
    steps: int = 0
    tokens: int = 0
    windows: int = 0
    last_step_s: float = 0.0
    busy_s: float = 0.0
    """Wall time spent in steps (encoder and decoder) since the engine started."""
    last_encoder_batch: int = 0
    step_times: deque = field(default_factory=lambda: deque(maxlen=200))
    started: float = field(default_factory=time.monotonic)


class Engine:
    """One model on one device, shared by every session and upload of the process."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig(), precision: str | None = None,
                 cpu_threads: int | None = None):
        """`precision`: a `cuda_ops` preset (kernels + FP8 sites) applied to the model; None keeps
        the plain PyTorch model. `cpu_threads`: intra-op threads of the model thread on the CPU
        (None: torch's current setting)."""
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.config = config
        self.precision = precision
        cross_fp8 = False
        if precision is not None:
            from cuda_ops.precision import get_preset
            from streamer.model.fused import apply_precision

            preset = get_preset(precision)
            apply_precision(loaded.model, preset)
            cross_fp8 = preset.cross_kv_cache == "fp8"
        device = next(loaded.model.parameters()).device
        slots, enc_batch = self._limits(loaded, config, device, cross_fp8)
        self.runner = Runner(loaded, slots, config.max_new_tokens, config.cuda_graphs, cross_fp8, config.overlap_encoder)
        self.cpu_threads = cpu_threads or torch.get_num_threads()
        self.runner.warmup()  # CUDA graphs captured before serving, not on the first busy step
        if self.runner.device.type == "cuda":
            self.runner.warm_encoder(enc_batch)
            self.warm_admission()
        self.scheduler = Scheduler(SchedulerConfig(max_slots=slots, max_encoder_batch=enc_batch, max_queue=config.max_queue))
        self.metrics_data = EngineMetrics()
        self._handles: dict[str, Handle] = {}
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._calls: list = []
        self._thread: threading.Thread | None = None

    def warm_admission(self) -> None:
        """Admit and decode a few windows of silence through each admission path before serving.

        On CUDA the first use of a kernel specialisation compiles it (Triton) or plans it: 0.3 to
        3 s on an H200, paid by the first live finals of the server otherwise. Prompts of several
        lengths, with and without timestamps, a beam search and a batch of two cover the shapes
        a prefill takes; so does a window with timestamps and no prompt, whose prefill on an
        English-only model is `<|startoftranscript|>` alone: one token, so it goes through the
        one-token attention kernel (a live stream's first final; it compiled there, 0.8 s, until
        this window was added). Call before the engine thread starts (the constructor does, on CUDA)."""
        silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
        batches = [[DecodeOptions(timestamps=True)], [DecodeOptions()],
                   [DecodeOptions(timestamps=False), DecodeOptions(prompt="warm " * 13)],
                   [DecodeOptions(prompt="warm " * 40)], [DecodeOptions(beam_size=2, prompt="warm " * 5)]]
        for i, batch in enumerate(batches):
            requests = [Request(id=f"warmup{i}.{j}", audio=silence, options=dataclasses.replace(o, temperatures=(0.0,)),
                                priority=Priority.FILE, deadline=0.0, arrival=0.0) for j, o in enumerate(batch)]
            self.runner.step(requests)
            for _ in range(WARMUP_MAX_STEPS):
                if not self.runner.slots:
                    break
                self.runner.step([])
            self.runner.step([], released=[s.id for s in self.runner.slots])

    @classmethod
    def load(cls, model: ModelConfig = ModelConfig(), config: EngineConfig = EngineConfig()) -> "Engine":
        device, dtype = resolve_device(model)
        if device.type == "cuda" and config.vram_limit_gb:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, config.vram_limit_gb * 2**30 / total), device)
        # Our kernels and FP8 sites need CUDA (and fp16/bf16); the CPU runs the plain model.
        precision = model.precision if device.type == "cuda" and dtype != torch.float32 else None
        if device.type != "cpu":
            return cls(load_model(model.model, device, dtype), config, precision)
        # On the CPU only the model thread runs torch on several threads. Every thread that ever
        # ran a parallel op keeps an OpenMP pool, and once the threads libgomp manages outnumber
        # the cores it stops spin-waiting: each of a decoder step's ~60 small ops then pays a
        # wake-up (tiny.en, 2 cores, 29-s window: 1.24 s with the loading thread's pool, 1.12 s
        # without). So the model is loaded on one thread.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return cls(load_model(model.model, device, dtype), config, precision, cpu_threads=threads)
        finally:
            torch.set_num_threads(threads)

    @staticmethod
    def _limits(loaded: LoadedModel, config: EngineConfig, device: torch.device, cross_fp8: bool) -> tuple[int, int]:
        """Decoder slots and encoder batch: given, or sized from the device's memory budget."""
        if device.type != "cuda":
            return config.max_slots or 16, config.max_encoder_batch or 4
        itemsize = next(loaded.model.parameters()).element_size()
        free, total = torch.cuda.mem_get_info(device)
        budget = min(free, config.vram_limit_gb * 2**30 - torch.cuda.memory_allocated(device)) if config.vram_limit_gb else free
        d = loaded.dims
        # Encoder activations per window: a few [1500, 4D] tensors live at once; keep a margin.
        per_window = 8 * d.n_audio_ctx * 4 * d.n_audio_state * itemsize
        enc_batch = config.max_encoder_batch or 16
        usable = 0.85 * budget - enc_batch * per_window - 2 * 2**30  # graphs, logits, allocator slack
        slots = config.max_slots or int(max(1, min(512, usable // KVCache.bytes_per_slot(d, itemsize, cross_fp8))))
        return slots, enc_batch

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="streamer-engine", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking work, finish what is live or queued (up to `timeout`), stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # --- submission -------------------------------------------------------------------------------

    def submit(self, audio: np.ndarray | None = None, options: DecodeOptions | None = None, *,
               priority: Priority = Priority.FILE, session_id: str | None = None, features=None,
               stream_tokens: bool = False) -> Handle:
        """Queue one window (≤ 30 s); must be called from a running event loop. Raises QueueFull."""
        if self._closed:
            raise EngineClosed("the engine is shutting down")
        options = options or DecodeOptions()
        if options.language is not None and self.tokenizer.multilingual:
            self.tokenizer.language_token(options.language)  # ValueError now, not in the model thread
        if options.beam_size > MAX_BEAM:
            raise ValueError(f"beam_size {options.beam_size}: at most {MAX_BEAM}")
        if options.prompt_tokens:
            self.tokenizer.prompt_from_tokens(options.prompt_tokens, 2)  # ValueError for ids it cannot take
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        request = Request(id=f"w{next(self._ids)}", audio=None if audio is None else np.asarray(audio, np.float32),
                          features=features, options=options, priority=priority, session_id=session_id,
                          deadline=now + ADMISSION_DEADLINE_S[priority], arrival=now)
        handle = Handle(self, request, loop, stream_tokens)
        self._enqueue(request, handle)
        if self._thread is None:
            self.start()
        return handle

    async def transcribe(self, audio: np.ndarray, options: DecodeOptions | None = None, **kw) -> Result:
        return await self.submit(audio, options, **kw).result()

    def _enqueue(self, request: Request, handle: Handle) -> None:
        with self._cond:
            replaced = self.scheduler.add(request)  # raises QueueFull
            self._handles[request.id] = handle
            self._cond.notify()
        if replaced is not None:
            self._finish(self._handles.pop(replaced.id, None), error=Cancelled("replaced by a newer partial"))

    def cancel(self, handle: Handle) -> None:
        with self._cond:
            self.scheduler.cancel(handle.request.id)
            self._handles.pop(handle.request.id, None)
            self._cond.notify()
        self._finish(handle, error=Cancelled("cancelled"))

    async def call(self, fn, *args):
        """Run `fn(*args)` on the model thread between two steps (e.g. word alignment), await its value."""
        if self._closed:
            raise EngineClosed("the engine is shutting down")
        future = asyncio.get_running_loop().create_future()
        with self._cond:
            self._calls.append((fn, args, future))
            self._cond.notify()
        if self._thread is None:
            self.start()
        return await future

    def _run_calls(self) -> None:
        with self._cond:
            calls, self._calls = self._calls, []
        for fn, args, future in calls:
            try:
                with sdpa_kernel(SDPA_BACKENDS):  # varying shapes (e.g. alignment): no cuDNN plans
                    value, error = fn(*args), None
            except Exception as e:
                value, error = None, e
            loop = future.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(
                    lambda f=future, v=value, e=error: f.done() or (f.set_exception(e) if e else f.set_result(v)))

    # --- the model thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        if self.runner.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)  # this thread's own setting
        while True:
            if self._calls:
                self._run_calls()
            with self._cond:
                while not self.scheduler.has_work and not self._closed and not self._calls:
                    self._cond.wait()
                if self._calls:
                    continue
                if self._closed and not self.scheduler.has_work:
                    return
                plan = self.scheduler.schedule(time.monotonic())
                if plan.empty:
                    self._cond.wait(0.01)
                    continue
                preempted = [self._handles.pop(r.id, None) for r in plan.preempted]
            for h in preempted:
                self._finish(h, error=Cancelled("preempted by a final"))
            t0 = time.perf_counter()
            try:
                res = self.runner.step(plan.encode, plan.released)
            except Exception as e:  # a broken step must not kill the thread: fail what it held
                log.exception("engine step failed")
                failed = {r.id: repr(e) for r in plan.encode} | {i: repr(e) for i in plan.decode}
                self.runner.slots.clear()
                with self._cond:
                    self.scheduler.update(StepOutput(failed=failed))
                    handles = [self._handles.pop(i, None) for i in failed]
                for h in handles:
                    self._finish(h, error=RuntimeError(f"engine step failed: {e}"))
                continue
            finished = [s.id for s in res.finished]
            with self._cond:
                self.scheduler.update(StepOutput(encoded=res.encoded, finished=finished))
            self._account(res, plan, time.perf_counter() - t0)
            for rid, token in res.tokens:
                h = self._handles.get(rid)
                if h is not None and h._tokens is not None:
                    h.future.get_loop().call_soon_threadsafe(h._tokens.put_nowait, token)
            for seq in res.finished:
                self._complete(seq)

    def _account(self, res, plan, dt: float) -> None:
        m = self.metrics_data
        m.steps += 1
        m.tokens += len(res.tokens)
        m.windows += len(res.encoded)
        m.last_step_s = dt
        m.busy_s += dt
        m.last_encoder_batch = len(plan.encode)
        m.step_times.append(dt)

    def _complete(self, seq: Sequence) -> None:
        """Turn a finished sequence into a Result, or retry it hotter (temperature fallback).

        When every temperature fails the checks, the best attempt is kept (`best_attempt`), not
        the hottest one as openai/whisper does: speech that repeats itself legitimately can fail
        the compression check at every temperature, and the hottest sample is then random text."""
        req = seq.request
        opts = req.options
        result = self.build_result(seq)
        with self._cond:
            handle = self._handles.pop(req.id, None)
        if result.verdict.fallback and handle is not None:
            handle.attempts.append(result)
            if req.attempt + 1 < len(opts.temperatures) and not self._closed:
                # A hotter attempt samples: one slot, no beams (openai/whisper does the same).
                retry = dataclasses.replace(req, id=f"{req.id.split('.')[0]}.{req.attempt + 1}", attempt=req.attempt + 1,
                                            temperature=opts.temperatures[req.attempt + 1], state=RequestState.QUEUED,
                                            options=dataclasses.replace(opts, beam_size=1), n_slots=1)
                with self._cond:
                    handle.request = retry
                    try:
                        self.scheduler.add(retry)
                        self._handles[retry.id] = handle
                        self._cond.notify()
                        return
                    except QueueFull:
                        pass  # no room for a retry: settle with the attempts so far
            result = best_attempt(handle.attempts, opts.compression_ratio_threshold)
        self._finish(handle, result=result)

    def build_result(self, seq: Sequence) -> Result:
        tok = self.tokenizer
        req = seq.request
        duration = (len(req.audio) if req.audio is not None else MAX_WINDOW_SAMPLES) / SAMPLE_RATE
        tokens = [t for t in seq.tokens if t != tok.eot]
        text = tok.decode(tokens)
        avg_logprob = seq.sum_logprob / max(1, len(seq.tokens))
        ratio = compression_ratio(text)
        truncated = not seq.tokens or seq.tokens[-1] != tok.eot
        # Judged on the whole decoded text, also when it turns out to be silence.
        verdict = judge(text, avg_logprob, seq.no_speech_prob, ratio, truncated, req.options, req.temperature)
        segments = []
        if not verdict.silence:
            for i, (start, end, seg_tokens) in enumerate(split_segments(tokens, tok, duration)):
                seg_text = tok.decode(seg_tokens)
                if seg_text.strip():
                    segments.append(Segment(id=i, start=start, end=min(end, max(duration, start)), text=seg_text,
                                            tokens=seg_tokens, avg_logprob=avg_logprob, no_speech_prob=seq.no_speech_prob,
                                            compression_ratio=ratio, temperature=req.temperature))
        text = "".join(s.text for s in segments)
        return Result(request_id=req.id.split(".")[0], text=text.strip(), tokens=tokens, segments=segments,
                      language=seq.language, avg_logprob=avg_logprob, no_speech_prob=seq.no_speech_prob,
                      compression_ratio=ratio, temperature=req.temperature, duration=duration,
                      truncated=truncated, verdict=verdict)

    def _finish(self, handle: Handle | None, result: Result | None = None, error: Exception | None = None) -> None:
        if handle is None:
            return
        loop = handle.future.get_loop()

        def settle():
            if not handle.future.done():
                if error is not None:
                    handle.future.set_exception(error)
                else:
                    handle.future.set_result(result)
            if handle._tokens is not None:
                handle._tokens.put_nowait(None)

        if loop.is_closed():
            return
        loop.call_soon_threadsafe(settle)

    # --- metrics ----------------------------------------------------------------------------------

    def metrics(self) -> dict:
        m = self.metrics_data
        times = sorted(m.step_times)
        elapsed = max(1e-9, time.monotonic() - m.started)
        return {
            "queue_depth": self.scheduler.queue_depth, "live_sequences": self.scheduler.live,
            "free_slots": self.scheduler.free_slots, "slots": self.runner.n_slots, "steps": m.steps,
            "tokens": m.tokens, "windows": m.windows, "tokens_per_s": m.tokens / elapsed, "busy_s": m.busy_s,
            "last_step_ms": 1000 * m.last_step_s, "encoder_batch": m.last_encoder_batch,
            "step_ms_p50": 1000 * times[len(times) // 2] if times else 0.0,
        }

    @property
    def model_name(self) -> str:
        return self.loaded.name
