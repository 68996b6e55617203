"""The generation thread: the only code that runs the model, one step at a time.

The loop: take commands (new requests, aborts, pause/resume, weight updates), admit waiting requests while the
batch has room (each is prefilled alone and samples its first token), then decode one token for every row of the
batch. Commands are handled between steps, so a weight update never lands in the middle of a forward pass.
When there is nothing to do the thread blocks on its inbox, so an idle engine costs nothing.

Pause, as vLLM's `/pause?mode=`: requests that arrive after a pause wait until resume; the mode decides what
happens to the ones already there:
- `abort`: they finish at once with finish_reason "abort" (and the tokens they had);
- `wait`: they run to completion; the pause call returns when the last one is done;
- `keep`: they freeze where they are and continue on resume (a weight update in between applies to the rest of
  their tokens, as in vLLM).

Events go back to the event loop in one `call_soon_threadsafe` per step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from trainer.engine.batch import DecodeBatch, next_token_logits, prefill
from trainer.engine.prefix_cache import PrefixCache
from trainer.engine.config import LogprobsMode
from trainer.engine.errors import EngineError, EngineStopped, GenerationFailed
from trainer.engine.generation import Finish, GenerationStream, PromptLogprobs, TokenUpdate
from trainer.engine.logprobs import TokenLogprob, gather_logprobs, prompt_logprobs
from trainer.engine.model import PolicyModel, apply_weights
from trainer.engine.sampling import RowSampling, sample_next

__all__ = ["PauseMode", "Worker"]

log = logging.getLogger(__name__)

PauseMode = Literal["abort", "wait", "keep"]


@dataclass(eq=False)
class _Sequence:
    order: int  # arrival order; requests at or after a pause's mark wait for resume
    stream: GenerationStream
    sampling: RowSampling
    stop_ids: frozenset[int]  # besides the tokenizer's eos, which `_finish` checks on its own
    min_tokens_banned: tuple[int, ...]  # every stop token, masked while fewer than min_tokens are out
    output_ids: list[int] = field(default_factory=list)

    def sampling_now(self) -> RowSampling:
        if len(self.output_ids) < self.stream.request.params.min_tokens:
            return replace(self.sampling, banned=self.min_tokens_banned)
        return self.sampling


@dataclass(frozen=True)
class _Submit:
    stream: GenerationStream


@dataclass(frozen=True)
class _Abort:
    stream: GenerationStream


@dataclass(frozen=True)
class _Control:
    action: Callable[[], object]  # runs on the worker thread between steps
    future: Future


@dataclass(frozen=True)
class _Pause:
    mode: PauseMode
    future: Future


_STOP = object()


class Worker:
    def __init__(
        self,
        policy: PolicyModel,
        *,
        loop: asyncio.AbstractEventLoop,
        max_model_len: int,
        max_batch_size: int,
        logprobs_mode: LogprobsMode,
        threads: int,
        seed: int,
        prompt_logprobs_chunk: int,
        prefix_cache_bytes: int = 0,
    ) -> None:
        self._policy = policy
        self._loop = loop
        self._max_model_len = max_model_len
        self._max_batch_size = max_batch_size
        self._logprobs_mode = logprobs_mode
        self._threads = threads
        self._prompt_logprobs_chunk = prompt_logprobs_chunk
        self.prefixes = PrefixCache(prefix_cache_bytes)  # read by tests and benchmarks (hits, reused_tokens)
        self._shared_generator = torch.Generator().manual_seed(seed)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._waiting: deque[_Sequence] = deque()
        self._batch: DecodeBatch[_Sequence] = DecodeBatch(policy.model)
        self._outbox: list[tuple[GenerationStream, object]] = []
        self._admitting: _Sequence | None = None
        self._next_order = 0
        self._hold_from: int | None = None  # paused: sequences with order >= this are not admitted
        self._frozen = False  # paused with mode=keep: nothing steps
        self._drain_waiters: list[Future] = []  # pause(mode=wait) calls not yet answered
        self._stopping = False
        self.weight_version = 0
        self.peak_batch_size = 0  # most rows decoded together so far (tests and benchmarks read it)

    # ------------------------------------------------------------------ thread-safe entry points

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._inbox.put(_STOP)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def paused(self) -> bool:
        return self._hold_from is not None

    @property
    def active_requests(self) -> int:
        """Requests waiting or generating (a racy read from another thread, fine for monitoring)."""
        return len(self._batch) + len(self._waiting)

    def submit(self, stream: GenerationStream) -> None:
        self._inbox.put(_Submit(stream))

    def abort(self, stream: GenerationStream) -> None:
        self._inbox.put(_Abort(stream))

    def pause(self, mode: PauseMode) -> Future:
        future: Future = Future()
        self._inbox.put(_Pause(mode, future))
        return future

    def resume(self) -> Future:
        return self._control(self._resume)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Future:
        """Replace weights between steps; the future's result is the new weight version."""
        return self._control(lambda: self._update_weights(named_tensors))

    def _control(self, action: Callable[[], object]) -> Future:
        future: Future = Future()
        self._inbox.put(_Control(action, future))
        return future

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        torch.set_num_threads(self._threads)
        with torch.inference_mode():
            while not self._stopping:
                try:
                    self._take_commands(block=not self._has_work())
                    if self._stopping:
                        break
                    self._admit()
                    if len(self._batch) and not self._frozen:
                        self._decode()
                except Exception as exc:  # top-level capture: fail the requests in the step, keep serving the rest
                    log.exception("generation step failed")
                    failed = [*self._batch.rows, *([self._admitting] if self._admitting else [])]
                    self._fail(failed, GenerationFailed(f"generation failed: {exc!r}"))
                    self._admitting = None
                self._flush()  # before answering a pause(wait): its caller sees the finished requests' events first
                self._answer_drain_waiters()
        self._fail([*self._batch.rows, *self._waiting], EngineStopped("the engine is shutting down"))
        for waiter in self._drain_waiters:
            waiter.set_result(None)
        self._drain_waiters.clear()
        self._flush()

    def _has_work(self) -> bool:
        if self._frozen:
            return False
        return bool(len(self._batch)) or any(self._admissible(seq) for seq in self._waiting)

    def _admissible(self, seq: _Sequence) -> bool:
        return self._hold_from is None or seq.order < self._hold_from

    def _take_commands(self, *, block: bool) -> None:
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if command is _STOP:
                self._stopping = True
                return
            if isinstance(command, _Submit):
                self._waiting.append(self._new_sequence(command.stream))
            elif isinstance(command, _Abort):
                self._abort(lambda seq: seq.stream is command.stream)
            elif isinstance(command, _Pause):
                self._pause(command.mode, command.future)
            else:
                try:
                    command.future.set_result(command.action())
                except Exception as exc:  # the caller gets the error through its future
                    command.future.set_exception(exc)

    def _new_sequence(self, stream: GenerationStream) -> _Sequence:
        params = stream.request.params
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else self._shared_generator
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(self._policy.extra_eos_token_ids)
        # vLLM masks all of these for min_tokens, ignore_eos or not; ids outside the logits cannot be sampled anyway.
        every_stop = {*params.stop_token_ids, *self._policy.extra_eos_token_ids, self._policy.eos_token_id}
        vocab = self._policy.vocab_size
        self._next_order += 1
        return _Sequence(
            order=self._next_order - 1,
            stream=stream,
            sampling=RowSampling(params.temperature, params.top_k, params.top_p, generator, params.logit_bias),
            stop_ids=frozenset(stop_ids),
            min_tokens_banned=tuple(sorted(i for i in every_stop if i is not None and 0 <= i < vocab)),
        )

    # ------------------------------------------------------------------ generation

    def _admit(self) -> None:
        if self._frozen:
            return
        while len(self._batch) < self._max_batch_size:
            seq = next((s for s in self._waiting if self._admissible(s)), None)
            if seq is None:
                return
            self._waiting.remove(seq)
            self._admitting = seq  # neither waiting nor in the batch: a failure must still reach it
            self._prefill(seq)
            self._admitting = None
            self.peak_batch_size = max(self.peak_batch_size, len(self._batch))

    def _prefill(self, seq: _Sequence) -> None:
        request = seq.stream.request
        model = self._policy.model
        whole = request.params.prompt_logprobs is not None  # every position's hidden state is wanted
        hidden, cache = prefill(model, request.prompt_ids, None if whole else self.prefixes.lookup(request.prompt_ids))
        self.prefixes.add(request.prompt_ids, cache)
        if whole:
            targets = torch.tensor(request.prompt_ids[1:], device=hidden.device)
            entries = prompt_logprobs(
                model.get_output_embeddings(), hidden[0, :-1], targets, request.params.prompt_logprobs,
                chunk=self._prompt_logprobs_chunk,
            )
            self._outbox.append((seq.stream, PromptLogprobs((None, *entries))))
        if not self._sample([seq], next_token_logits(model, hidden)):
            self._batch.add(seq, cache, len(request.prompt_ids))

    def _decode(self) -> None:
        rows = list(self._batch.rows)
        logits = self._batch.step([seq.output_ids[-1] for seq in rows])
        self._batch.remove(self._sample(rows, logits))

    def _sample(self, rows: list[_Sequence], logits: torch.Tensor) -> list[_Sequence]:
        """Sample the next token of each row, send it, and return the rows that finished."""
        wanted = [seq.stream.request.params.logprobs for seq in rows]
        with_logprobs = any(n is not None for n in wanted)
        tokens, logprobs = sample_next(
            logits, [seq.sampling_now() for seq in rows], logprobs_mode=self._logprobs_mode, with_logprobs=with_logprobs
        )
        records: list[TokenLogprob | None] = [None] * len(rows)
        if logprobs is not None:
            picked = [i for i, n in enumerate(wanted) if n is not None]
            most = -1 if any(wanted[i] < 0 for i in picked) else max(wanted[i] for i in picked)
            index = torch.tensor(picked, device=logprobs.device)
            for i, record in zip(picked, gather_logprobs(logprobs[index], tokens[index], most), strict=True):
                records[i] = record if wanted[i] < 0 else replace(record, top=record.top[: wanted[i]])
        finished = []
        for seq, token, record in zip(rows, tokens.tolist(), records, strict=True):
            seq.output_ids.append(token)
            self._outbox.append((seq.stream, TokenUpdate(token, record)))
            finish = self._finish(seq, token)
            if finish is not None:
                self._outbox.append((seq.stream, finish))
                finished.append(seq)
        return finished

    def _finish(self, seq: _Sequence, token: int) -> Finish | None:
        """vLLM's check_stop: nothing before min_tokens, then the tokenizer's eos, stop_token_ids, the length limits."""
        params = seq.stream.request.params
        if len(seq.output_ids) < params.min_tokens:
            return None
        if token == self._policy.eos_token_id and not params.ignore_eos:
            return Finish("stop", None, self.weight_version)
        if token in seq.stop_ids:
            return Finish("stop", token, self.weight_version)
        total = len(seq.stream.request.prompt_ids) + len(seq.output_ids)
        if total >= self._max_model_len or len(seq.output_ids) >= params.max_tokens:
            return Finish("length", None, self.weight_version)
        return None

    # ------------------------------------------------------------------ control

    def _abort(self, which: Callable[[_Sequence], bool]) -> None:
        running = [seq for seq in self._batch.rows if which(seq)]
        self._batch.remove(running)
        waiting = [seq for seq in self._waiting if which(seq)]
        for seq in waiting:
            self._waiting.remove(seq)
        for seq in running + waiting:
            self._outbox.append((seq.stream, Finish("abort", None, self.weight_version)))

    def _pause(self, mode: PauseMode, future: Future) -> None:
        if self._hold_from is None:
            self._hold_from = self._next_order
        if mode == "abort":
            self._abort(self._admissible)
            future.set_result(None)
        elif mode == "keep":
            self._frozen = True
            future.set_result(None)
        else:
            self._drain_waiters.append(future)

    def _resume(self) -> None:
        self._hold_from = None
        self._frozen = False
        self._answer_drain_waiters(force=True)

    def _answer_drain_waiters(self, *, force: bool = False) -> None:
        if not self._drain_waiters:
            return
        drained = not len(self._batch) and not any(self._admissible(seq) for seq in self._waiting)
        if drained or force:
            for waiter in self._drain_waiters:
                waiter.set_result(None)
            self._drain_waiters.clear()

    def _update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        apply_weights(self._policy.model, named_tensors)
        self.prefixes.clear()  # keys and values of the old weights
        self.weight_version += 1
        return self.weight_version

    def _fail(self, seqs: list[_Sequence], error: EngineError) -> None:
        for seq in seqs:
            self._outbox.append((seq.stream, error))
            if seq in self._waiting:
                self._waiting.remove(seq)
        self._batch.remove(seqs)

    def _flush(self) -> None:
        if not self._outbox:
            return
        events, self._outbox = self._outbox, []
        try:
            self._loop.call_soon_threadsafe(_deliver, events)
        except RuntimeError:  # the loop is closed: nobody is left to read these
            pass


def _deliver(events: list[tuple[GenerationStream, object]]) -> None:
    for stream, event in events:
        stream.deliver(event)

