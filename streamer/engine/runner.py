"""Executes engine steps on the model: batched features + encoder + prefill for admitted windows,
then one decoder step for every live sequence over preallocated slots.

Live sequences always occupy slots `[0, n)`: when one leaves, the last one moves into its slot.
A decoder step is then a view of the first n slots, which is what a CUDA graph per batch bucket
needs (static addresses); moving one slot costs one copy of its K/V, once per finished sequence.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from cuda_ops._triton import as_in_graphs
from cuda_ops.decode_linear import warm_linears
from streamer.audio.features import log_mel_spectrogram
from streamer.engine.beam import TOPK, BeamGroup, Hypothesis
from streamer.engine.partition import green_pair
from streamer.engine.request import SAMPLE_RATE, Priority
from streamer.model.decoding import attempt_seed
from streamer.model.logits import LogitRules, SamplerState, gumbel_
from streamer.model.weights import LoadedModel
from streamer.model.cpu_linear import HALF_LINEARS, with_half_weights
from streamer.model.whisper import KVCache, SharedCross

# Attention backends per path, chosen by whether the path's shapes are fixed and planned before
# serving. cuDNN's attention builds an execution plan for every new shape (0.1-1 s each on an H200,
# torch 2.11) and is then the fastest kernel there; flash and memory-efficient attention need no plan.
PLANNED = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
UNPLANNED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
SDPA_PATHS = {
    # The captured decoder step: one shape per batch bucket, planned when `warmup` captures it.
    # cuDNN measured on the H200 (issue 15, full_fp16, large-v3 shape; its cross-attention is SDPA):
    # step 18.2 -> 11.2 ms at 128 windows, 35.7 -> 19.8 ms at 256 against flash.
    "graph_step": PLANNED,
    # The encoder: one shape per batch size, every plan built by `warm_encoder` at start. cuDNN is
    # what torch chose by itself on the H200 when the encoder was measured (session 3); the order is
    # set here because the encoder also runs inside a step's prefill context, whose order is flash first.
    "encoder": PLANNED,
    # Prefill (and language detection): a shape per prompt length, so cuDNN would plan on live
    # finals: first token p50 127 ms / max 1.06 s with it, 17 / 18 ms without (bench_prefill.py, H200).
    "prefill": UNPLANNED,
    # The decoder step without CUDA graphs: its self-attention length grows every step.
    "eager_step": UNPLANNED,
    # `Engine.call` (word alignment and the like): arbitrary shapes.
    "calls": UNPLANNED,
}
SDPA_BACKENDS = SDPA_PATHS["calls"]  # what engine.py's `_run_calls` enters


def sdpa_backends(path: str) -> list[SDPBackend]:
    """The attention backends, in priority order, that `path` (a key of SDPA_PATHS) may use."""
    return list(SDPA_PATHS[path])


def attention_for(path: str):
    """Context: only `path`'s backends enabled, in its order (set_priority, torch >= 2.6)."""
    return sdpa_kernel(sdpa_backends(path), set_priority=True)


# Decoder batch sizes captured as CUDA graphs; a step runs in the smallest bucket that fits.
CAPTURE_MODE = "thread_local"
"""CUDA graph capture checks only the capturing thread's calls: an engine's captures must not fail
because another thread (e.g. one freeing an old engine's graphs) makes a CUDA call meanwhile."""
GRAPH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)


@dataclass
class Sequence:
    """A live decoding sequence in a slot (host-side bookkeeping)."""

    request: object  # engine.request.Request
    initial: list[int]  # prompt + start-of-transcript tokens + forced prefix, fed before sampling
    sot_index: int
    language: str
    max_new: int
    no_speech_prob: float = 0.0
    tokens: list[int] = field(default_factory=list)  # sampled so far
    sum_logprob: float = 0.0
    logprobs: list[float] = field(default_factory=list)  # per sampled token (greedy/sampling; not beams)
    done: bool = False
    group: BeamGroup | None = None  # beam search: the slots of one request share a group
    beam: Hypothesis | None = None  # beam search: this slot's hypothesis (None before the first token)
    generator: torch.Generator | None = None  # a sampled attempt's own draws, seeded from the request

    @property
    def id(self) -> str:
        return self.request.id


@dataclass
class _Encoding:
    """A batch in its encoder pass on the side stream."""

    requests: list  # None where a request was released (cancelled) during the pass
    features: torch.Tensor
    done: torch.cuda.Event

    def release(self, gone: set[str]) -> None:
        """Mark the requests in `gone` as released; their rows of `features` are then skipped."""
        self.requests = [r if r is not None and r.id not in gone else None for r in self.requests]


@dataclass
class _EncoderGraph:
    """The encoder captured at one batch size: `mel` in, `out` out (static buffers). `out` is
    overwritten by the next replay, so each batch's features are used (their cross K/V written)
    before the next batch is encoded: encoder batches run one at a time, and a pass on the side
    stream waits for the main stream's queued work first."""

    graph: torch.cuda.CUDAGraph
    mel: torch.Tensor  # [B, n_mels, 3000], model dtype
    out: torch.Tensor  # [B, n_audio_ctx, D]


@dataclass
class _InFlight:
    """Sampled tokens not yet read back (`Runner.async_steps`): of a decode step, or of an admission's
    first tokens; the sequences of its rows, in row order at launch, and its tokens and
    log-probabilities (and, for an admission, no-speech probabilities) on their way to the host."""

    seqs: list[Sequence]
    tokens: torch.Tensor  # [n] int64, pinned host memory, valid once `done` has passed
    logprobs: torch.Tensor  # [n] float32, likewise
    done: torch.cuda.Event | None  # None on the CPU
    no_speech: torch.Tensor | None = None  # [n] float32, likewise (an admission's)


@dataclass
class _BeamMoves:
    """What one step's beam groups change on the device, gathered so that it goes there in one
    copy: every beam's sampler fields (n_sampled, last, penultimate, last_timestamp) by row, and
    the self K/V moves (source row, row) of the beams that continue another row's hypothesis
    (about one in five of a beam search's; copying all rows and each group apart cost three
    host-to-device copies per group and step)."""

    rows: list[int] = field(default_factory=list)
    fields: list[list[int]] = field(default_factory=list)
    moves: list[tuple[int, int]] = field(default_factory=list)
    upto: int = 0  # self K/V positions written, the longest beam's


class _PrefillInputs(NamedTuple):
    """An admission's per-row inputs on the device, copied from the host before its encoder pass."""

    tokens: torch.Tensor  # [k, T] initial tokens, shorter rows padded
    last: torch.Tensor  # [k] position of the last initial token
    sot: torch.Tensor  # [k] position of <|startoftranscript|>
    timestamps: torch.Tensor  # [k] bool: timestamp rules on
    temperature: torch.Tensor  # [k] float32


@dataclass
class StepResult:
    encoded: list[str] = field(default_factory=list)
    encoding: list[str] = field(default_factory=list)  # still in their encoder pass (side stream)
    tokens: list[tuple[str, int]] = field(default_factory=list)  # (request id, sampled token)
    finished: list[Sequence] = field(default_factory=list)
    encode_s: float = 0.0
    decode_s: float = 0.0


class Runner:
    def __init__(self, loaded: LoadedModel, n_slots: int, max_new_tokens: int = 224, cuda_graphs: bool = True,
                 cross_format: str = "fp16", overlap_encoder: bool = False, decode_priority: bool = True,
                 encoder_graphs: bool = True, async_steps: bool | None = None, step_sms: int = 0,
                 kv_slots: int = 16):
        self.loaded = loaded
        self.model = loaded.model
        self.tok = loaded.tokenizer
        self.dims = loaded.dims
        p = next(self.model.decoder.parameters())  # the encoder may run in another dtype (cpu_encoder.py)
        self.device, self.dtype = p.device, p.dtype
        self.n_slots = n_slots
        self.max_new_tokens = max_new_tokens
        self.cache = KVCache(self.dims, n_slots, self.device, self.dtype, cross_format=cross_format, kv_slots=kv_slots)
        if self.device.type == "cpu":
            self.model = with_half_weights(self.model)
        self.state = SamplerState.allocate(n_slots, self.device)
        self.rules = LogitRules(self.tok, self.dims.n_vocab, loaded.suppress_tokens, loaded.begin_suppress_tokens, self.device)
        self.tokens_in = torch.zeros(n_slots, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(n_slots, dtype=torch.long, device=self.device)
        self.slots: list[Sequence] = []
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.use_encoder_graphs = self.use_graphs and encoder_graphs
        # File windows' decode steps are launched before the previous one is read back: the host's
        # bookkeeping of step N (tokens to requests, finished rows, the scheduler's next plan) runs
        # while the GPU runs step N + 1, instead of the GPU waiting for it (~1.5 ms a step at 256
        # large-v3 windows: rtf +5 %, docs/benchmarks.md, session 12). A sequence that ended at step
        # N is decoded once more, for nothing, and its result comes a step later: not while a live
        # window decodes (1,000 tiny.en streams, H200: p95 finalisation 1.25 s with it, 1.14 s
        # without, same call), nor with a beam search live (its next step depends on the host's
        # choice of beams). Default: on with CUDA graphs; on the CPU the step is the host.
        self.async_steps = self.use_graphs if async_steps is None else async_steps
        # Read-backs pending, oldest first: at most a decode step's and an admission's first tokens.
        self.in_flight: list[_InFlight] = []
        if step_sms < 0 or (step_sms and not overlap_encoder):
            raise ValueError(f"step_sms={step_sms}: the SMs decode steps keep while an encoder pass runs beside "
                             "them (overlap_encoder), or 0")
        # With `step_sms`: the encoder on a green context of the SMs the steps leave it, and the
        # steps, while a pass runs, from graphs captured on a green context of `step_sms` SMs
        # (`self.confined`); when none runs, from the usual graphs on every SM.
        self.step_part = encoder_part = None
        if step_sms and overlap_encoder and self.use_graphs:
            self.step_part, encoder_part = green_pair(step_sms, self.device)
        # A second stream for the encoder: a batch's encoder pass (compute-bound) runs beside the
        # decode steps (memory-bound) of the sequences already live, which go on at their own pace
        # instead of waiting for it; the batch joins them in the first step after its pass is done.
        self.side = None
        if overlap_encoder and self.device.type == "cuda":
            self.side = encoder_part.stream if encoder_part is not None else torch.cuda.Stream(self.device)
        # With the side stream, steps run on a stream of higher priority than the side stream
        # (CUDA's default priority is its lowest): whenever SMs free up, the block scheduler
        # dispatches the decode step's small memory-bound kernels before more encoder blocks, so
        # a step is not stretched by the encoder pass running beside it.
        self.main = torch.cuda.Stream(self.device, priority=-1) if self.side is not None and decode_priority else None
        self.confined: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.confined_steps = 0  # steps launched from `self.confined` (tests, benchmarks)
        self.encoding: list[_Encoding] = []
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.encoder_graphs: dict[int, _EncoderGraph] = {}  # by batch size, captured by `warm_encoder`
        self.encoder_pool = None
        # the encoder graphs' capture stream (made on first use); on an SM partition the encoder's
        # green context's, which confines the graphs
        self.encoder_stream = encoder_part.stream if encoder_part is not None else None
        self.gumbel = None  # [slots, V] Gumbel draws of the sampled rows: the captured steps' input
        self.logprobs = None  # [slots, V] every token's log-probability: the captured steps' output
        self.pool = None
        lang_ids = sorted(self.tok.language_tokens.values())
        self.language_ids = torch.tensor(lang_ids, device=self.device)

    @property
    def live(self) -> int:
        return len(self.slots)

    # --- one engine step ------------------------------------------------------------------------

    def step(self, encode: list, released: list[str] = (), decode: bool = True) -> StepResult:
        """Drop `released` sequences, decode one token for every live one (none without `decode`:
        the scheduler holds them while files fill the batch), then admit `encode` (with a side
        stream: start its encoder pass, and admit the batches whose pass is done)."""
        with torch.inference_mode(), attention_for("prefill"), self._on_main():  # graphs captured in `_capture` bring their own
            return self._step(encode, released, decode)

    @contextlib.contextmanager
    def _on_main(self):
        """Run the step on `self.main` when there is one, ordered after the caller's stream's work
        and before whatever the caller's stream does next (e.g. `Engine.call` between steps)."""
        if self.main is None:
            yield
            return
        caller = torch.cuda.current_stream(self.device)
        self.main.wait_stream(caller)
        with torch.cuda.stream(self.main):
            yield
        caller.wait_stream(self.main)

    def _step(self, encode: list, released: list[str], decode: bool = True) -> StepResult:
        out = StepResult()
        if released:
            gone = set(released)
            self._remove_rows([i for i, s in enumerate(self.slots) if s.id in gone])
            for batch in self.encoding:
                batch.release(gone)
        if encode and self.side is not None:
            t0 = time.perf_counter()
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                features = self._encode(encode)  # queued: runs beside the decode steps
                done = torch.cuda.Event()
                done.record(self.side)
            self.encoding.append(_Encoding(list(encode), features, done))
            encode = []
            out.encode_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        # Held (`decode` False: files filling the batch): nothing launched, and a step in flight stays
        # in flight. Reading it back now would leave the GPU idle from its end until this admission's
        # kernels are queued (37 ms of a 1.64-s run of 128 large-v3 windows, H100, session 33).
        if decode and self.slots and self.async_steps and all(s.group is None and s.request.priority == Priority.FILE
                                                              for s in self.slots):
            self._decode_async(out)
        elif decode:
            self._finish_in_flight(out)  # before a step read back at once (or nothing live: its sequences ended)
            if self.slots:
                n = len(self.slots)
                tokens, logprobs, top = self._decode(n)  # copies to the host wait for this stream only
                self._record(list(range(n)), tokens.tolist(), logprobs.tolist(), top, out)
        out.decode_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        if encode:
            self._admit(encode, out)
        self._admit_encoded(out, wait=not self.slots)
        out.encode_s += time.perf_counter() - t0
        return out

    def _admit_encoded(self, out: StepResult, wait: bool) -> None:
        """Admit the side-stream batches whose encoder pass is done, oldest first; with `wait`
        (nothing live to decode meanwhile) wait for them."""
        main = torch.cuda.current_stream() if self.encoding else None
        while self.encoding and (wait or self.encoding[0].done.query()):
            batch = self.encoding.pop(0)
            main.wait_event(batch.done)
            batch.features.record_stream(main)  # made on the side stream, used and freed on this one
            keep = [i for i, r in enumerate(batch.requests) if r is not None]  # not cancelled meanwhile
            if keep:
                features = batch.features if len(keep) == len(batch.requests) else batch.features[keep]
                self._admit([batch.requests[i] for i in keep], out, features)
        out.encoding.extend(self._encoding_ids())

    def _encoding_ids(self) -> list[str]:
        """Ids of the requests in their encoder pass on the side stream (cancelled ones left out)."""
        return [r.id for b in self.encoding for r in b.requests if r is not None]

    def execute(self, plan) -> StepResult:
        """Run one `engine.scheduler.StepPlan` exactly: the scheduler's plan is the contract, and a
        runner whose live sequences or encoder passes differ from it refuses to step (one source of
        truth: a mismatch is a bug, found here rather than as a wrong transcript later)."""
        gone = set(plan.released)
        live = {s.id for s in self.slots} - gone
        planned = set(plan.decode) | set(plan.held)
        if live != planned or (plan.decode and plan.held):
            raise RuntimeError(f"plan/runner mismatch: the plan decodes {len(set(plan.decode))} sequences and holds "
                               f"{len(set(plan.held))}, the runner holds {len(live)} (only in the plan: "
                               f"{sorted(planned - live)[:3]}, only here: {sorted(live - planned)[:3]})")
        encoding = set(self._encoding_ids()) - gone
        if encoding != set(plan.encoding):
            raise RuntimeError(f"plan/runner mismatch: encoder passes {sorted(set(plan.encoding))[:3]} in the plan, "
                               f"{sorted(encoding)[:3]} here")
        return self.step(plan.encode, plan.released, decode=not plan.held)

    def reset(self) -> None:
        """Drop every live sequence and encoder pass (after a failed step: the scheduler fails them)."""
        self.slots.clear()
        self.encoding.clear()
        self.in_flight = []

    def _decode_async(self, out: StepResult) -> None:
        """Launch a decode step over the live rows, then read back and record the step before it
        (its tokens are for the sequences that were live then; those ended or released since are
        skipped). The new step stays in flight until the next call."""
        n = len(self.slots)
        tokens, logprobs, _ = self._launch(n)
        launched = self._flight(list(self.slots), tokens, logprobs)  # before the next step overwrites them
        self._finish_in_flight(out)
        # Every sequence of the new step ended at the one before: its tokens are nobody's.
        self.in_flight = [launched] if self.slots else []

    def _flight(self, seqs: list[Sequence], tokens: torch.Tensor, logprobs: torch.Tensor,
                no_speech: torch.Tensor | None = None) -> _InFlight:
        """Queue the copies of `seqs`' sampled tokens (rows [0, len(seqs)) of the device tensors) to
        pinned host memory; nothing waits for them until `_finish_in_flight`."""
        n = len(seqs)
        cuda = self.device.type == "cuda"  # (on the CPU, for tests: the step is done already)

        def host(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            h = torch.empty(n, dtype=dtype, pin_memory=cuda)
            return h.copy_(t[:n], non_blocking=cuda)

        flight = _InFlight(seqs, host(tokens, torch.long), host(logprobs, torch.float32), None,
                           None if no_speech is None else host(no_speech, torch.float32))
        if cuda:  # recorded after the copies: it passes once they are done
            flight.done = torch.cuda.Event()
            flight.done.record()
        return flight

    def _finish_in_flight(self, out: StepResult) -> None:
        """Record the read-backs pending, oldest first: wait for their copies, take the tokens of
        their sequences that are still live (rows as they are now), remove the rows that end."""
        flights, self.in_flight = self.in_flight, []
        for flight in flights:
            if flight.done is not None:
                flight.done.synchronize()
            row_of = {id(s): i for i, s in enumerate(self.slots)}
            if flight.no_speech is not None:
                for seq, p in zip(flight.seqs, flight.no_speech.tolist()):
                    seq.no_speech_prob = p
            rows, tokens, logprobs = [], [], []
            for seq, token, logprob in zip(flight.seqs, flight.tokens.tolist(), flight.logprobs.tolist()):
                row = row_of.get(id(seq))
                if row is not None:
                    rows.append(row)
                    tokens.append(token)
                    logprobs.append(logprob)
            self._record(rows, tokens, logprobs, None, out)

    def _record(self, rows: list[int], tokens: list[int], logprobs: list[float], top, out: StepResult) -> None:
        finished = []
        groups: dict[int, list[int]] = {}
        for row, token, logprob in zip(rows, tokens, logprobs):
            seq = self.slots[row]
            if seq.group is not None:
                groups.setdefault(id(seq.group), []).append(row)
                continue
            seq.tokens.append(token)
            seq.sum_logprob += logprob
            seq.logprobs.append(logprob)
            out.tokens.append((seq.id, token))
            position = len(seq.initial) + len(seq.tokens)
            if token == self.tok.eot or len(seq.tokens) >= seq.max_new or position >= self.dims.n_text_ctx:
                seq.done = True
                finished.append(row)
        beams = _BeamMoves()
        if groups:  # the grouped rows' candidates as lists, once (not every row's, not per group)
            grouped = torch.tensor([r for group_rows in groups.values() for r in group_rows])
            top_lp, top_ids = top[0][grouped].tolist(), top[1][grouped].tolist()
            i = 0
            for group_rows in groups.values():
                j = i + len(group_rows)
                finished += self._advance_beams(group_rows, top_lp[i:j], top_ids[i:j], out, beams)
                i = j
        self._move_beams(beams)
        for row in sorted(finished, reverse=True):
            if self.slots[row].group is None or self.slots[row].done:
                out.finished.append(self.slots[row])
        self._remove_rows(finished)

    def _advance_beams(self, rows: list[int], top_lp: list[list[float]], top_ids: list[list[int]], out: StepResult,
                       moves: _BeamMoves) -> list[int]:
        """Choose the group's next beams from its rows' top candidates; what their K/V and sampler
        state need on the device goes into `moves` (`_move_beams` applies every group's at once).

        Returns the group's rows when it is finished (the first row then holds the best hypothesis).
        """
        seqs = [self.slots[r] for r in rows]
        group = seqs[0].group
        if seqs[0].beam is None:  # first token: every beam still has the same prefix
            beams = group.first(top_lp[0], top_ids[0])
            sources = list(range(len(beams)))
        else:
            beams = group.select([s.beam for s in seqs], top_lp, top_ids)
            sources = [b.source for b in beams]
        if group.done(beams) or len(beams) < len(rows):
            best = group.best(beams)
            head = seqs[0]
            head.tokens, head.sum_logprob, head.done = best.tokens, best.sum_logprob, True
            out.tokens.extend((head.id, t) for t in best.tokens[-1:])
            return rows
        moves.moves += [(rows[i], row) for i, row in zip(sources, rows) if rows[i] != row]
        moves.upto = max(moves.upto, max(len(s.initial) + len(s.tokens) for s in seqs))
        for seq, beam in zip(seqs, beams):
            seq.tokens, seq.sum_logprob, seq.beam = beam.tokens, beam.sum_logprob, beam
        moves.rows += rows
        moves.fields += [[len(b.tokens), b.tokens[-1], b.tokens[-2] if len(b.tokens) > 1 else -1, b.last_timestamp]
                         for b in beams]
        return []

    def _move_beams(self, beams: _BeamMoves) -> None:
        """Apply a step's `_BeamMoves`: one copy to the device, one self K/V copy for every moved
        beam (gathered before any is written, so rows that swap hypotheses are safe), one write per
        sampler field."""
        if not beams.rows:
            return
        n, m = len(beams.rows), len(beams.moves)
        flat = beams.rows + [v for f in beams.fields for v in f] + [r for move in beams.moves for r in move]
        values = self._to_device(torch.tensor(flat))
        dst, fields, moves = values[:n], values[n:5 * n].view(n, 4), values[5 * n:].view(m, 2)
        if m:
            self.cache.copy_slots(moves[:, 0], moves[:, 1], upto=beams.upto)
        for j, name in enumerate(("n_sampled", "last", "penultimate", "last_timestamp")):
            getattr(self.state, name)[dst] = fields[:, j]
        self.tokens_in[dst] = fields[:, 1]

    def _remove_rows(self, rows: list[int]) -> None:
        """Drop the sequences in `rows`; live ones past the new end move into the holes, with one
        indexed copy per buffer for all of them. (Moving the last row into each hole one at a time
        took ~26 small copies per ended sequence: 10 % of the engine core's time at 400 live
        streams on the H200, py-spy.)"""
        gone = set(rows)
        if not gone:
            return
        n = len(self.slots)
        keep = n - len(gone)
        holes = [r for r in sorted(gone) if r < keep]
        movers = [i for i in range(keep, n) if i not in gone]
        if holes:
            dst, src = self._to_device(torch.tensor([holes, movers])).unbind()
            # Positions written: each mover's tokens, plus an admission's first token and a launched
            # step that may both be unread (async_steps).
            upto = min(max(len(self.slots[m].initial) + len(self.slots[m].tokens) for m in movers) + 2,
                       self.dims.n_text_ctx)
            self.cache.move_rows(src, dst, upto, pairs=list(zip(movers, holes)))
            self.state.move_rows(src, dst)
            self.tokens_in[dst] = self.tokens_in[src]
            self.positions[dst] = self.positions[src]
            for h, m in zip(holes, movers):
                self.slots[h] = self.slots[m]
        del self.slots[keep:]

    # --- decoder step -------------------------------------------------------------------------------

    def _decode_rows(self, b: int, gumbel, kv_len: int | None = None, timestamps: bool = True,
                     logprobs_out: torch.Tensor | None = None,
                     shared: SharedCross | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dec = self.model.decoder
        hidden = dec(self.tokens_in[:b, None], self.positions[:b, None], 0, self.cache, kv_len, shared_cross=shared)
        # the logits as the projection leaves them (fp16 on a GPU): the fused sampler reads them once a pass
        logits = dec.logits(hidden[:, -1], upcast=False)
        tokens, logprobs, every = self.rules.sample(logits, self.state, gumbel, timestamps, logprobs_out)
        self.state.advance(tokens, self.tok.timestamp_begin)
        self.tokens_in[:b] = tokens
        # Rows past the live ones (graph padding) keep counting: clamp so they stay in range.
        self.positions[:b] = (self.positions[:b] + 1).clamp_max(self.dims.n_text_ctx - 1)
        return tokens, logprobs, every

    def _shared_cross(self, n: int) -> SharedCross | None:
        """Rows [0, n) as `SharedCross`: each beam group's rows (their cross K/V are copies of their
        window's: written so at admission, and beam moves copy only self K/V), the rest in runs;
        None without a group of two or more rows."""
        groups: dict[int, list[int]] = {}
        for row, seq in enumerate(self.slots[:n]):
            if seq.group is not None:
                groups.setdefault(id(seq.group), []).append(row)
        shared = [rows for rows in groups.values() if len(rows) > 1]
        if not shared:
            return None
        alone, lo = [], 0
        for row in sorted(r for rows in shared for r in rows) + [n]:  # the runs between grouped rows
            if row > lo:
                alone.append((lo, row))
            lo = row + 1
        return SharedCross([(rows[0], torch.tensor(rows)) for rows in shared], alone)

    def bucket(self, n: int) -> int:
        """The captured batch size that runs a step of n live sequences."""
        return next((x for x in GRAPH_BUCKETS if x >= n), n)

    def warmup(self) -> None:
        """Capture every graph bucket up to the slot count now, not on the first busy step."""
        if self.device.type == "cuda":
            self._warm_sampler()
        if self.use_graphs:
            with torch.inference_mode():
                for b in GRAPH_BUCKETS:
                    if b > self.n_slots:
                        break
                    self._graph(b)
                    if self.step_part is not None:
                        self._graph(b, confined=True)

    def _warm_sampler(self) -> None:
        """Sample once in every form a step may take (logits as the step or the prefill leaves
        them, with and without timestamp rules, greedy or with Gumbel noise), so that the fused
        sampler's Triton variants compile now: each is compiled on its first use, ~1 s in which
        the engine thread, and every stream with it, would wait (the first sampled fallback of a
        live server, the first window without timestamps)."""
        dec, V = self.model.decoder, self.dims.n_vocab
        state = self.state.rows(slice(0, 1))  # read only: `sample` does not advance the state
        with torch.inference_mode():
            hidden = dec.token_embedding.weight[:1]
            # as a step and a prefill leave them: dtype and row stride are part of a variant's key
            for logits in (dec.logits(hidden, upcast=False), dec.logits(hidden)):
                for timestamps in (True, False):
                    for gumbel in (None, torch.zeros(1, V, device=self.device)):
                        self.rules.sample(logits, state, gumbel, timestamps)
        torch.cuda.synchronize(self.device)

    def _graph(self, b: int, confined: bool = False):
        if self.gumbel is None:
            self.gumbel = torch.zeros(self.n_slots, self.dims.n_vocab, device=self.device)
            self.logprobs = torch.zeros(self.n_slots, self.dims.n_vocab, device=self.device)
        graphs = self.confined if confined else self.graphs
        if b not in graphs:  # both sets share one pool: a step runs from one of them at a time
            graphs[b] = self._capture(b, self.step_part.stream if confined else None)
        return graphs[b]

    def _decode(self, n: int) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """One decode step over rows [0, n), read back: tokens, log-probabilities, top candidates."""
        tokens, logprobs, every = self._launch(n)
        return tokens[:n].cpu(), logprobs[:n].float().cpu(), self._top_to_host(every, n)

    def _launch(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queue one decode step over rows [0, n) (a graph replay, or eager without graphs): tokens,
        their log-probabilities and every token's, on the device, covering at least n rows (a
        graph's until its next replay)."""
        any_hot = any(s.request.temperature > 0 for s in self.slots)
        b = min(self.bucket(n), self.n_slots) if self.use_graphs else n  # the rows the step reads
        self.model.decoder.fill_cross_kv(self.cache, slice(0, n), b)  # a hybrid cache's K/V that it reads
        if not self.use_graphs:
            gumbel = self._gumbel(torch.zeros(n, self.dims.n_vocab, device=self.device), self.slots) if any_hot else None
            # Past every row's position (a sequence that ended at an unread step is one ahead).
            kv_len = min(max(len(s.initial) + len(s.tokens) for s in self.slots) + bool(self.in_flight),
                         self.dims.n_text_ctx)
            timestamps = any(s.request.options.timestamps for s in self.slots)
            shared = self._shared_cross(n) if self.device.type == "cpu" else None
            with attention_for("eager_step"):
                return self._decode_rows(n, gumbel, kv_len, timestamps, shared=shared)
        confined = self.step_part is not None and bool(self.encoding)  # an encoder pass runs beside it
        self.confined_steps += confined
        graph, tokens, logprobs, every = self._graph(b, confined)
        if any_hot:
            self._gumbel(self.gumbel[:b], self.slots)
        graph.replay()
        return tokens, logprobs, every

    @staticmethod
    def _gumbel(gumbel: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Fill the rows of `gumbel` [B, V] that sample with Gumbel draws, each from its own
        sequence's generator, so that a request's samples do not depend on what else shares the
        step (rows decoded greedily ignore theirs)."""
        for row, seq in enumerate(seqs[:gumbel.shape[0]]):
            if seq.generator is not None:
                gumbel_(gumbel[row], seq.generator)
        return gumbel

    def _top_to_host(self, every: torch.Tensor, n: int):
        """Top TOPK (log-probabilities, ids) per row from every token's log-probabilities [>= n, V],
        taken and copied only when a beam search is live (else None)."""
        if not any(s.group is not None for s in self.slots):
            return None
        top_lp, top_ids = every[:n].topk(TOPK, dim=-1)
        return top_lp.float().cpu(), top_ids.cpu()

    def _capture(self, b: int, stream: torch.cuda.Stream | None = None):
        """Capture one decoder step over rows [0, b) as a CUDA graph (state saved and restored), on
        `stream` (torch's capture stream by default; a green context's stream confines the graph to
        its SMs wherever it is replayed: benchmarks/probe_green.py)."""
        saved = [t.clone() for t in (self.tokens_in, self.positions)] + \
                [getattr(self.state, f).clone() for f in self.state.__dataclass_fields__]
        warm = stream if stream is not None else torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with attention_for("graph_step"):  # the backend chosen here is baked into the graph
            with torch.cuda.stream(warm), as_in_graphs():
                for _ in range(2):  # warm-up outside the graph (allocations, kernel selection, cuDNN plans)
                    self._decode_rows(b, self.gumbel[:b], logprobs_out=self.logprobs[:b])
            torch.cuda.current_stream().wait_stream(warm)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode=CAPTURE_MODE):  # one pool for every bucket
                tokens, logprobs, every = self._decode_rows(b, self.gumbel[:b], logprobs_out=self.logprobs[:b])
        self.tokens_in.copy_(saved[0])
        self.positions.copy_(saved[1])
        for f, t in zip(self.state.__dataclass_fields__, saved[2:]):
            getattr(self.state, f).copy_(t)
        return graph, tokens, logprobs, every

    # --- admission: encoder, language detection, prefill ---------------------------------------------

    def _encode(self, requests: list) -> torch.Tensor:
        """Log-mel and encoder output [len(requests), n_audio_ctx, d] of the requests' windows."""
        mel = log_mel_spectrogram([r.audio for r in requests], self.dims.n_mels, device=self.device)
        return self._encoder(mel)

    def _encoder(self, mel: torch.Tensor) -> torch.Tensor:
        """Encoder output [B, n_audio_ctx, D]; from the batch size's CUDA graph when captured
        (then valid until the next batch of that size is encoded: see `_EncoderGraph`)."""
        g = self.encoder_graphs.get(mel.shape[0])
        if g is None:
            with attention_for("encoder"):
                return self.model.encoder(mel.to(self.dtype))
        g.mel.copy_(mel)
        g.graph.replay()
        return g.out

    def warm_linears(self) -> None:
        """Have cuBLAS look up its kernel for the decoder blocks' per-token linears (`HALF_LINEARS`:
        not cross_kv, which runs per window) at every row count an eager prefill runs them at (`decode_linear.row_bucket`): ~260 us a new shape on the H200, paid
        otherwise by live finals whose prompts have a new length."""
        if self.device.type == "cuda":
            with torch.inference_mode():
                warm_linears([getattr(b, name) for b in self.model.decoder.blocks for name in HALF_LINEARS], self.device)

    def warm_encoder(self, max_batch: int) -> None:
        """Run the encoder once at every batch size up to `max_batch` (kernel plans, allocations)
        and, with CUDA graphs, capture it at each. Launching a large encoder's ~400 kernels from
        Python took 28 % of the engine core's model thread at 200 live turbo-shape streams on the
        H200 (py-spy), time in which no decode step could be launched; a replay is one launch."""
        silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
        with torch.inference_mode():
            for b in range(1, max_batch + 1):
                mel = log_mel_spectrogram([silence] * b, self.dims.n_mels, device=self.device)
                if self.use_encoder_graphs:
                    self.encoder_graphs[b] = self._capture_encoder(mel)
                else:
                    self._encoder(mel)

    def _capture_encoder(self, mel: torch.Tensor) -> _EncoderGraph:
        static = mel.to(self.dtype).clone()
        # A capture stream of the encoder's own: cuBLAS keeps a workspace per (handle, stream), and
        # a graph replays with the workspace of the stream it was captured on. The decoder's graphs
        # are captured on torch's default capture stream; captured there too, an encoder pass on
        # the side stream would share their workspace while a decode step runs beside it.
        if self.encoder_stream is None:
            self.encoder_stream = torch.cuda.Stream(self.device)
        stream = self.encoder_stream
        stream.wait_stream(torch.cuda.current_stream())
        with attention_for("encoder"):  # the backend chosen here is baked into the graph
            with torch.cuda.stream(stream), as_in_graphs():
                for _ in range(2):  # warm-up outside the graph (allocations, kernel selection, cuDNN plans)
                    self.model.encoder(static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self.encoder_pool is None:  # one pool for every encoder graph: they never run at once
                self.encoder_pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.encoder_pool, stream=stream, capture_error_mode=CAPTURE_MODE):
                out = self.model.encoder(static)
        return _EncoderGraph(graph, static, out)

    def _admit(self, requests: list, out: StepResult, audio_features: torch.Tensor | None = None) -> None:
        """Admit `requests` into free slots: their windows' cross K/V (encoded now unless
        `audio_features` come from an encoder pass that already ran), language detection, prefill
        and the first sampled token."""
        # A beam search of width n takes n rows; its window is encoded once and its K/V copied.
        expanded = [r for r in requests for _ in range(r.options.beam_size)]
        k, lo = len(expanded), len(self.slots)
        if lo + k > self.n_slots:
            raise RuntimeError(f"{lo + k} sequences for {self.n_slots} slots: the scheduler over-admitted")
        # What the host builds goes to the GPU before the encoder pass is queued: a copy from
        # pageable memory returns only once the stream's earlier work is done, so a copy made after
        # the pass held the host until the pass ended, and the prefill's ~800 launches then ran
        # with the GPU idle (H200, 256 large-v3 windows: 0.43 s of a 4.0-s wall in fp16, 0.75 of
        # 3.6 in FP8; `profile_engine.py`). Detecting a language needs the pass first.
        widths = torch.tensor([r.options.beam_size for r in requests], device=self.device) if k != len(requests) else None
        prepared = None if self._detects(expanded) else self._prepare(expanded, lo)
        if audio_features is None:
            audio_features = self._encode(requests)
        if widths is not None:
            audio_features = audio_features.repeat_interleave(widths, dim=0)
        self.model.decoder.write_cross_kv(audio_features, self.cache, lo)
        self.model.decoder.fill_cross_kv(self.cache, slice(lo, lo + k))  # for the detection and prefill below
        seqs, inputs = prepared or self._prepare(expanded, lo)
        logits, no_speech = self._prefill(lo, inputs)
        self._sample_first(seqs, logits, no_speech, lo, inputs, out)
        out.encoded.extend(r.id for r in requests)

    def _sequences(self, requests: list, languages: list[str]) -> list[Sequence]:
        """One `Sequence` per row: its initial tokens (built at submit time) with the language in
        place, token limit, beam group and, for a sampled attempt, its own seeded generator."""
        seqs, groups = [], {}
        for r, language in zip(requests, languages):
            opts = r.options
            if r.initial is None:
                raise ValueError(f"request {r.id} has no initial tokens (decoding.initial_tokens builds them at submit)")
            initial = r.initial.with_language(self.tok.language_token(language)) if r.initial.language_index is not None \
                else list(r.initial.tokens)
            limit = min(opts.max_new_tokens or self.max_new_tokens, self.dims.n_text_ctx - len(initial))
            group = None
            if opts.beam_size > 1:
                group = groups.setdefault(r.id, BeamGroup(opts.beam_size, self.tok.eot, limit,
                                                          length_penalty=opts.length_penalty,
                                                          timestamp_begin=self.tok.timestamp_begin))
            generator = None
            if r.temperature > 0:
                generator = torch.Generator(self.device)
                generator.manual_seed(attempt_seed(opts, np.ascontiguousarray(r.audio), r.attempt))
            seqs.append(Sequence(r, initial, r.initial.sot_index, language, limit, group=group, generator=generator))
        return seqs

    def _prepare(self, requests: list, lo: int) -> tuple[list[Sequence], _PrefillInputs]:
        """The rows' sequences (slots `lo...`) and prefill inputs; a language to detect reads the
        rows' cross K/V, so it must come after `write_cross_kv`."""
        seqs = self._sequences(requests, self._languages(requests, lo))
        return seqs, self._prefill_inputs(seqs)

    def _prefill_inputs(self, seqs: list[Sequence]) -> _PrefillInputs:
        """The admission's per-row inputs, on their way to the device (see `_to_device`)."""
        length = max(len(s.initial) for s in seqs)
        tokens = torch.full((len(seqs), length), self.tok.eot, dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, :len(s.initial)] = torch.tensor(s.initial)
        index = torch.tensor([[len(s.initial) - 1, s.sot_index, s.request.options.timestamps] for s in seqs])
        temperature = torch.tensor([s.request.temperature for s in seqs], dtype=torch.float32)
        tokens, index, temperature = (self._to_device(t) for t in (tokens, index, temperature))
        return _PrefillInputs(tokens, index[:, 0], index[:, 1], index[:, 2].bool(), temperature)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host tensor `t` on the device without holding the thread: a copy from pageable memory
        waits for the stream's queued work (a decode step, an encoder pass) and leaves the GPU idle
        once it has run; through pinned memory the copy is queued like a kernel. (The caching host
        allocator reuses the pinned buffer only once the copy is done.)"""
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _prefill(self, lo: int, inputs: _PrefillInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each row's initial tokens into slots `lo...` (self-attention K/V written): the logits
        after its last initial token [k, V] and its no-speech probability [k], on the device."""
        dec = self.model.decoder
        k, length = inputs.tokens.shape
        positions = torch.arange(length, device=self.device).expand(k, length)
        hidden = dec(inputs.tokens, positions, lo, self.cache, length)  # [k, T, D]
        rows = torch.arange(k, device=self.device)
        no_speech = dec.logits(hidden[rows, inputs.sot]).float().softmax(-1)[:, self.tok.no_speech]
        return dec.logits(hidden[rows, inputs.last]), no_speech

    def _sample_first(self, seqs: list[Sequence], logits: torch.Tensor, no_speech: torch.Tensor, lo: int,
                      inputs: _PrefillInputs, out: StepResult) -> None:
        """Sample each new row's first token from its prefill `logits`, set its sampler state and
        step inputs, and take the rows into `slots` (beam groups pick their first beams). No host
        sync where file windows alone decode (`async_steps`): the first tokens are read back with
        the next step's, like a step in flight, so the host goes on to queue that step while the
        GPU still runs this admission (else the GPU idled from the read-back to the next launch:
        0.18-0.26 s of a 2.6-s run of 256 large-v3 windows on the H200, `profile_engine.py`)."""
        k = len(seqs)
        requests = [s.request for s in seqs]
        rs = slice(lo, lo + k)
        self.state.reset(rs, inputs.timestamps, inputs.temperature)
        for i, r in enumerate(requests):
            if r.options.prefix_tokens:
                self.state.follow(lo + i, list(r.options.prefix_tokens), self.tok.timestamp_begin)
        hot = any(r.temperature > 0 for r in requests)
        gumbel = self._gumbel(torch.zeros(k, self.dims.n_vocab, device=self.device), seqs) if hot else None
        sampled, logprobs, every = self.rules.sample(logits, self.state.rows(rs), gumbel,
                                                     any(r.options.timestamps for r in requests))
        self.state.rows(rs).advance(sampled, self.tok.timestamp_begin)
        self.tokens_in[rs] = sampled
        self.positions[rs] = inputs.last + 1
        self.slots.extend(seqs)
        if self.async_steps and all(s.group is None and r.priority == Priority.FILE for s, r in zip(seqs, requests)):
            self.in_flight.append(self._flight(seqs, sampled, logprobs, no_speech))
            return
        for s, p in zip(seqs, no_speech.tolist()):
            s.no_speech_prob = p
        top = None
        if any(s.group is not None for s in seqs):  # rows of `_record` count from 0: pad the ones before lo
            top_lp, top_ids = every.topk(TOPK, dim=-1)
            top = (torch.cat([torch.zeros(lo, TOPK), top_lp.float().cpu()]),
                   torch.cat([torch.zeros(lo, TOPK, dtype=torch.long), top_ids.cpu()]))
        self._record(list(range(lo, lo + k)), sampled.tolist(), logprobs.float().tolist(), top, out)

    def _detects(self, requests: list) -> bool:
        """Whether `_languages` must run the decoder (a multilingual model, a language not given)."""
        return self.tok.multilingual and any(r.options.language is None for r in requests)

    def _languages(self, requests: list, lo: int) -> list[str]:
        """The requested language, or the likeliest one from the logits after `<|startoftranscript|>`."""
        if not self.tok.multilingual:
            return ["en"] * len(requests)
        detect = [i for i, r in enumerate(requests) if r.options.language is None]
        languages = [r.options.language for r in requests]
        if detect:
            k = len(requests)
            tokens = torch.full((k, 1), self.tok.sot, dtype=torch.long, device=self.device)
            positions = torch.zeros(k, 1, dtype=torch.long, device=self.device)
            logits = self.model.decoder.logits(self.model.decoder(tokens, positions, lo, self.cache)[:, 0])
            best = self.language_ids[logits[:, self.language_ids].argmax(-1)].tolist()
            for i in detect:
                languages[i] = self.tok.language_of_token[best[i]]
        return languages
