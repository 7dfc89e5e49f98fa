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
from typing import Callable

import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

from streamer.config import EngineConfig, ModelConfig
from streamer.engine.handle import Handle
from streamer.engine.errors import Cancelled, EngineClosed, EngineUnavailable
from streamer.engine.request import SAMPLE_RATE, DecodeOptions, check_options, Priority, Request, RequestState, Result
from streamer.engine.runner import SDPA_BACKENDS, Runner, Sequence
from streamer.engine.admission import Quotas
from streamer.engine.scheduler import QueueFull, Scheduler, SchedulerConfig, StepOutput
from streamer.model.cpu_encoder import resolve as resolve_cpu_encoder, with_cpu_encoder
from streamer.model.decoding import best_attempt, compression_ratio, initial_tokens, judge, split_segments
from streamer.model.weights import LoadedModel, load_model
from streamer.model.whisper import KVCache
from streamer.types import Segment

log = logging.getLogger("streamer.engine")

WARMUP_MAX_STEPS = 32
"""Decoder steps a warm-up window of silence may take (it usually ends at once)."""

# How long a caller is willing to wait for admission, by class: the scheduler orders by deadline.
ADMISSION_DEADLINE_S = {Priority.FINAL: 0.0, Priority.PARTIAL: 0.2, Priority.FILE: 5.0}

__all__ = ["Engine", "Handle", "EngineClosed", "EngineUnavailable", "Cancelled", "QueueFull", "resolve_device"]


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


@dataclass(eq=False)
class Ticket:
    """A submitted window as the model thread sees it: how to report back, and its attempts.

    `on_done(result, error)` is called exactly once, from whichever thread settles the window
    (the model thread, or the caller's on cancel); `on_tokens(tokens)` after each step that
    sampled tokens for it, when given. Both must be cheap and must not block."""

    request: Request
    on_done: Callable[[Result | None, Exception | None], None]
    on_tokens: Callable[[list[int]], None] | None = None
    attempts: list[Result] = field(default_factory=list)
    """Results of the attempts that failed the fallback checks (engine thread only)."""
    first_token_at: float | None = None
    """Monotonic time of the first sampled token of any attempt."""
    done: bool = False


@dataclass
class EngineMetrics:
    steps: int = 0
    tokens: int = 0
    windows: int = 0
    last_step_s: float = 0.0
    busy_s: float = 0.0
    """Wall time spent in steps (encoder and decoder) since the engine started."""
    encode_s: float = 0.0
    """Of which admitting windows: features, encoder, prefill (`StepResult.encode_s`)."""
    decode_s: float = 0.0
    """Of which decoder steps of live sequences."""
    last_encoder_batch: int = 0
    step_times: deque = field(default_factory=lambda: deque(maxlen=200))
    started: float = field(default_factory=time.monotonic)


class Engine:
    """One model on one device, shared by every session and upload of the process."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig(), precision: str | None = None,
                 cpu_threads: int | None = None, cpu_encoder: str = "float32"):
        """`precision`: a `cuda_ops` preset (kernels + FP8 sites) applied to the model; None keeps
        the plain PyTorch model. `cpu_threads`: intra-op threads of the model thread on the CPU
        (None: torch's current setting). `cpu_encoder`: the encoder's dtype on the CPU
        (`ModelConfig.cpu_encoder`; the plain float32 model by default here, `auto` from `load`)."""
        cross_format, kv_slots = "fp16", 0
        # A model off the CPU (or float32 asked) comes back as it is.
        loaded = dataclasses.replace(loaded, model=with_cpu_encoder(loaded.model, resolve_cpu_encoder(cpu_encoder)))
        if precision is not None:
            from cuda_ops.precision import get_preset
            from streamer.model.fused import apply_precision, cross_cache_format

            preset = get_preset(precision)
            loaded = dataclasses.replace(loaded, model=apply_precision(loaded.model, preset))  # the caller's model stays as it was
            cross_format, kv_slots = cross_cache_format(loaded.model, preset), preset.hybrid_kv_slots
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.config = config
        self.precision = precision
        device = next(loaded.model.parameters()).device
        slots, enc_batch = self._limits(loaded, config, device, cross_format, kv_slots)
        self.runner = Runner(loaded, slots, config.max_new_tokens, config.cuda_graphs, cross_format,
                             config.overlap_encoder, config.decode_priority, config.encoder_graphs,
                             config.async_steps, config.step_sms, kv_slots)
        self.cpu_threads = cpu_threads or torch.get_num_threads()
        self.runner.warmup()  # CUDA graphs captured before serving, not on the first busy step
        if self.runner.device.type == "cuda":
            self.runner.warm_encoder(enc_batch)
            self.warm_admission()
        self.scheduler = Scheduler(SchedulerConfig(max_slots=slots, max_encoder_batch=enc_batch, max_queue=config.max_queue,
                                                   encode_while_finals=self._encode_while_finals(config),
                                                   fill_files_first=config.fill_files_first))
        self.metrics_data = EngineMetrics()
        self._tickets: dict[str, Ticket] = {}
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
        this window was added). First, cuBLAS's kernels for the prefill's bucketed row counts
        (`Runner.warm_linears`). Call before the engine thread starts (the constructor does, on CUDA)."""
        self.runner.warm_linears()
        silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
        batches = [[DecodeOptions(timestamps=True)], [DecodeOptions()],
                   [DecodeOptions(timestamps=False), DecodeOptions(prompt="warm " * 13)],
                   [DecodeOptions(prompt="warm " * 40)], [DecodeOptions(beam_size=2, prompt="warm " * 5)]]
        # Through a scheduler of its own, as serving steps go (each batch is admitted in one step).
        scheduler = Scheduler(SchedulerConfig(max_slots=self.runner.n_slots, max_encoder_batch=2))
        for i, batch in enumerate(batches):
            requests = [Request(id=f"warmup{i}.{j}", audio=silence, options=o, initial=self._initial(o),
                                priority=Priority.FILE, deadline=0.0, arrival=0.0)
                        for j, o in enumerate(dataclasses.replace(o, temperatures=(0.0,)) for o in batch)]
            if sum(r.n_slots for r in requests) > self.runner.n_slots:
                continue  # a small engine (profile_engine --windows 1) warms what it can hold
            for request in requests:
                scheduler.add(request)
            plan = None
            for k in range(WARMUP_MAX_STEPS + 2):
                if k == WARMUP_MAX_STEPS:  # silence usually ends at once; whatever is left goes
                    # (the scheduler's live set is within the last plan: it is the source of truth)
                    for request_id in plan.decode + plan.held + plan.encoding + [r.id for r in plan.encode]:
                        scheduler.cancel(request_id)
                plan = scheduler.schedule(0.0)
                if plan.empty:
                    break
                res = self.runner.execute(plan)
                scheduler.update(StepOutput(encoded=res.encoded, finished=[s.id for s in res.finished],
                                            encoding=res.encoding))

    def warm_up(self) -> None:
        """One decode of a second of silence, so that the first client does not pay for lazy
        setup; blocks until it is done (any thread but the model thread)."""
        done = threading.Event()
        self.enqueue("warmup", np.zeros(SAMPLE_RATE, np.float32), DecodeOptions(), priority=Priority.FINAL,
                     on_done=lambda result, error: done.set())
        done.wait(120.0)

    @classmethod
    def load(cls, model: ModelConfig = ModelConfig(), config: EngineConfig = EngineConfig(),
             cpu_threads: int | None = None) -> "Engine":
        """`cpu_threads`: intra-op threads of the model thread on the CPU (None: torch's setting)."""
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
            return cls(load_model(model.model, device, dtype), config, precision, cpu_threads=cpu_threads or threads,
                       cpu_encoder=model.cpu_encoder)
        finally:
            torch.set_num_threads(threads)

    def _encode_while_finals(self, config: EngineConfig) -> int:
        if config.encode_while_finals is not None:
            return config.encode_while_finals
        return 0 if self.runner.device.type == "cpu" else 1

    @staticmethod
    def _limits(loaded: LoadedModel, config: EngineConfig, device: torch.device, cross_format: str,
                kv_slots: int = 0) -> tuple[int, int]:
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
        usable -= KVCache.pool_bytes(d, itemsize, cross_format, kv_slots)
        slots = config.max_slots or int(max(1, min(512, usable // KVCache.bytes_per_slot(d, itemsize, cross_format))))
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

    def check_options(self, options: DecodeOptions) -> None:
        """Raise ValueError now, in the caller's thread, for options the model cannot take."""
        check_options(options, self.tokenizer)

    def _initial(self, options: DecodeOptions):
        """The window's prompt, SOT sequence and prefix as tokens, built in the caller's thread."""
        return initial_tokens(options, self.tokenizer, self.loaded.dims.n_text_ctx)

    def enqueue(self, request_id: str, audio: np.ndarray, options: DecodeOptions, *, priority: Priority,
                on_done: Callable[[Result | None, Exception | None], None],
                on_tokens: Callable[[list[int]], None] | None = None, session_id: str | None = None,
                deadline: float | None = None) -> Ticket:
        """Queue one window (≤ 30 s) from any thread; the outcome goes to `on_done`. Raises
        QueueFull, EngineClosed or ValueError at once. `deadline` (monotonic seconds): when the
        window should be admitted; within a class the earliest goes first (live windows pass the
        wall time at which their audio ended at real-time pace, so a fast sender cannot overtake)."""
        if self._closed:
            raise EngineClosed("the engine is shutting down")
        self.check_options(options)
        now = time.monotonic()
        if deadline is None:
            deadline = now + ADMISSION_DEADLINE_S[priority]
        rate = self.loaded.synthetic_tokens_per_s
        if rate is not None:  # a speed-only shape: its length follows the audio's, one greedy attempt
            # Only the audio after a forced prefix is new (a live final's acoustic context).
            stamps = [t for t in options.prefix_tokens or () if t >= self.tokenizer.timestamp_begin]
            heard = self.tokenizer.time_of(max(stamps)) if stamps else 0.0
            n = max(1, round(rate * max(0.0, len(audio) / SAMPLE_RATE - heard)))
            options = dataclasses.replace(options, max_new_tokens=min(n, options.max_new_tokens or n),
                                          temperatures=(0.0,), beam_size=1)
        request = Request(id=request_id, audio=np.asarray(audio, np.float32), options=options,
                          initial=self._initial(options), priority=priority, session_id=session_id,
                          deadline=deadline, arrival=now)
        ticket = Ticket(request, on_done, on_tokens)
        with self._cond:
            replaced = self.scheduler.add(request)  # raises QueueFull
            self._tickets[request.id] = ticket
            self._cond.notify()
        if replaced is not None:
            self._finish(self._tickets.pop(replaced.id, None), error=Cancelled("replaced by a newer partial"))
        if self._thread is None:
            self.start()
        return ticket

    def submit(self, audio: np.ndarray, options: DecodeOptions | None = None, *,
               priority: Priority = Priority.FILE, session_id: str | None = None, stream_tokens: bool = False,
               deadline: float | None = None) -> Handle:
        """Queue one window (≤ 30 s); must be called from a running event loop. Raises QueueFull."""
        if self._closed:
            raise EngineClosed("the engine is shutting down")
        options = options or DecodeOptions()
        self.check_options(options)  # ValueError before anything else
        request_id = f"w{next(self._ids)}"
        handle = Handle(request_id, self.cancel_request, stream_tokens)
        self.enqueue(request_id, audio, options, priority=priority, session_id=session_id, deadline=deadline,
                     on_done=handle.settle_threadsafe, on_tokens=handle.push_tokens_threadsafe if stream_tokens else None)
        return handle

    async def transcribe(self, audio: np.ndarray, options: DecodeOptions | None = None, **kw) -> Result:
        return await self.submit(audio, options, **kw).result()

    def cancel_request(self, request_id: str) -> None:
        """Drop a window wherever it is (queued or decoding); its `on_done` gets `Cancelled`."""
        with self._cond:
            self.scheduler.cancel(request_id)
            ticket = self._tickets.pop(request_id, None)
            self._cond.notify()
        self._finish(ticket, error=Cancelled("cancelled"))

    def call_soon(self, fn, args: tuple, on_done: Callable[[object, Exception | None], None]) -> None:
        """Run `fn(*args)` on the model thread between two steps; its value goes to `on_done`."""
        if self._closed:
            raise EngineClosed("the engine is shutting down")
        with self._cond:
            self._calls.append((fn, args, on_done))
            self._cond.notify()
        if self._thread is None:
            self.start()

    async def call(self, fn, *args):
        """Run `fn(*args)` on the model thread between two steps (e.g. word alignment), await its value."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(value, error):
            if not loop.is_closed():
                loop.call_soon_threadsafe(
                    lambda: future.done() or (future.set_exception(error) if error else future.set_result(value)))

        self.call_soon(fn, args, done)
        return await future

    async def align(self, items: list, language: str | None, task: str) -> list:
        """Word timings of each `AlignmentItem` (`model.alignment.find_word_timings`), on the model thread."""
        from streamer.model.alignment import find_word_timings

        return await self.call(find_word_timings, self.loaded, items, language, task)

    def _run_calls(self) -> None:
        with self._cond:
            calls, self._calls = self._calls, []
        for fn, args, on_done in calls:
            try:
                with sdpa_kernel(SDPA_BACKENDS):  # varying shapes (e.g. alignment): no cuDNN plans
                    value, error = fn(*args), None
            except Exception as e:
                value, error = None, e
            on_done(value, error)

    # --- the model thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        # This thread's own setting. On a GPU its CPU-side ops are bookkeeping (joining the clips
        # of a batch, small index tensors): on one thread, because an OpenMP region over every
        # core waits for the last of its threads, and beside 8 gateways and a load client some are
        # always descheduled. Joining a batch's clips was 25 % of the model thread's samples at 200
        # live turbo-shape streams on the H200 (py-spy); with this and the encoder graphs, none.
        torch.set_num_threads(self.cpu_threads if self.runner.device.type == "cpu" else 1)
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
                preempted = [self._tickets.pop(r.id, None) for r in plan.preempted]
            for t in preempted:
                self._finish(t, error=Cancelled("preempted by a final"))
            t0 = time.perf_counter()
            try:
                res = self.runner.execute(plan)
            except Exception as e:  # a broken step must not kill the thread: fail what it held
                log.exception("engine step failed")
                failed = {r.id: repr(e) for r in plan.encode} | {i: repr(e) for i in plan.decode + plan.held + plan.encoding}
                self.runner.reset()
                with self._cond:
                    self.scheduler.update(StepOutput(failed=failed))
                    tickets = [self._tickets.pop(i, None) for i in failed]
                for t in tickets:
                    self._finish(t, error=RuntimeError(f"engine step failed: {e}"))
                continue
            finished = [s.id for s in res.finished]
            with self._cond:
                self.scheduler.update(StepOutput(encoded=res.encoded, finished=finished, encoding=res.encoding))
            self._account(res, plan, time.perf_counter() - t0)
            self._deliver_tokens(res.tokens)
            for seq in res.finished:
                self._complete(seq)

    def _deliver_tokens(self, tokens: list[tuple[str, int]]) -> None:
        """Note each window's first token; hand sampled tokens to the windows that stream them."""
        if not tokens:
            return
        now = time.monotonic()
        by_id: dict[str, list[int]] = {}
        for rid, token in tokens:
            by_id.setdefault(rid, []).append(token)
        for rid, toks in by_id.items():
            t = self._tickets.get(rid)
            if t is None:
                continue
            if t.first_token_at is None:
                t.first_token_at = now
            if t.on_tokens is not None:
                t.on_tokens(toks)

    def _account(self, res, plan, dt: float) -> None:
        m = self.metrics_data
        m.steps += 1
        m.tokens += len(res.tokens)
        m.windows += len(res.encoded)
        m.last_step_s = dt
        m.busy_s += dt
        m.encode_s += res.encode_s
        m.decode_s += res.decode_s
        m.last_encoder_batch = len(plan.encode)
        m.step_times.append(dt)

    def _complete(self, seq: Sequence) -> None:
        """Turn a finished sequence into a Result, or retry it hotter (temperature fallback).

        A retry is the same window under the same id, one attempt further, queued through the
        scheduler; its ticket stays registered meanwhile, so a cancel reaches it. When every
        temperature fails the checks, the best attempt is kept (`best_attempt`), not the hottest
        one as openai/whisper does: speech that repeats itself legitimately can fail the
        compression check at every temperature, and the hottest sample is then random text."""
        req = seq.request
        opts = req.options
        result = self.build_result(seq)
        with self._cond:
            ticket = self._tickets.get(req.id)
            if ticket is not None and result.verdict.fallback:
                ticket.attempts.append(result)
                if self._retry(ticket):
                    return
                result = best_attempt(ticket.attempts, opts.compression_ratio_threshold)
            self._tickets.pop(req.id, None)
        if ticket is not None:
            result.first_token_s = None if ticket.first_token_at is None else ticket.first_token_at - req.arrival
        self._finish(ticket, result=result)

    def _retry(self, ticket: Ticket) -> bool:
        """Queue the ticket's window at the next temperature (under `_cond`); False when none is
        left, the engine is closing, or the queue has no room (it settles with its attempts)."""
        req = ticket.request
        attempt = req.attempt + 1
        if attempt >= len(req.options.temperatures) or self._closed:
            return False
        # A hotter attempt samples: one slot, no beams (openai/whisper does the same).
        retry = dataclasses.replace(req, attempt=attempt, temperature=req.options.temperatures[attempt],
                                    state=RequestState.QUEUED, options=dataclasses.replace(req.options, beam_size=1),
                                    n_slots=1, error=None)
        try:
            self.scheduler.add(retry)
        except QueueFull:
            return False
        ticket.request = retry
        self._cond.notify()
        return True

    def build_result(self, seq: Sequence) -> Result:
        tok = self.tokenizer
        req = seq.request
        duration = len(req.audio) / SAMPLE_RATE
        tokens = [t for t in seq.tokens if t != tok.eot]
        logprobs = [lp for t, lp in zip(seq.tokens, seq.logprobs) if t != tok.eot] \
            if len(seq.logprobs) == len(seq.tokens) else []  # beams keep only their sums
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
        return Result(request_id=req.id, text=text.strip(), tokens=tokens, segments=segments,
                      language=seq.language, avg_logprob=avg_logprob, no_speech_prob=seq.no_speech_prob,
                      compression_ratio=ratio, temperature=req.temperature, duration=duration,
                      truncated=truncated, verdict=verdict, token_logprobs=logprobs)

    def _finish(self, ticket: Ticket | None, result: Result | None = None, error: Exception | None = None) -> None:
        if ticket is None or ticket.done:
            return
        ticket.done = True
        ticket.on_done(result, error)

    # --- metrics ----------------------------------------------------------------------------------

    def metrics(self) -> dict:
        m = self.metrics_data
        times = sorted(m.step_times)
        elapsed = max(1e-9, time.monotonic() - m.started)
        return {
            "queue_depth": self.scheduler.queue_depth, "live_sequences": self.scheduler.live,
            "free_slots": self.scheduler.free_slots, "slots": self.runner.n_slots, "steps": m.steps,
            "tokens": m.tokens, "windows": m.windows, "tokens_per_s": m.tokens / elapsed, "busy_s": m.busy_s,
            "encode_s": m.encode_s, "decode_s": m.decode_s,
            "last_step_ms": 1000 * m.last_step_s, "encoder_batch": m.last_encoder_batch,
            "step_ms_p50": 1000 * times[len(times) // 2] if times else 0.0,
        }

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def device(self) -> str:
        return str(self.runner.device)

    @property
    def ready(self) -> bool:
        """Loaded and warmed up (the constructor does both)."""
        return not self._closed

    @property
    def queue_depth(self) -> int:
        return self.scheduler.queue_depth

    @property
    def max_queue(self) -> int:
        return self.scheduler.config.max_queue

    @property
    def partial_queue_limit(self) -> int:
        """Queue depth from which partials are refused."""
        return self.scheduler.config.partial_queue_limit

    @property
    def quotas(self) -> Quotas:
        """The admission shares of this engine's queue (`engine/admission.py`)."""
        return self.scheduler.config.quotas
