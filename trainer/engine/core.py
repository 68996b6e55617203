"""The engine without HTTP: a loaded policy and its generation thread, driven from asyncio.

`async with EngineCore(config) as core:` loads the model (off the event loop), starts the worker thread, and on
exit stops it: in-flight requests fail with `EngineStopped`, then the thread is joined. Everything here is safe to
call from the event loop; nothing blocks it (model loading and weight file reading run in a thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from trainer.engine.config import EngineConfig
from trainer.engine.errors import EngineStopped
from trainer.engine.generation import GenerationRequest, GenerationResult, GenerationStream
from trainer.engine.model import PolicyModel, load_policy, read_safetensors_dir
from trainer.engine.prefix_cache import PrefixCache
from trainer.engine.sampling import SamplingParams
from trainer.engine.worker import PauseMode, Worker

__all__ = ["EngineCore"]


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._policy: PolicyModel | None = None
        self._worker: Worker | None = None

    async def __aenter__(self) -> EngineCore:
        policy = await asyncio.to_thread(
            load_policy, self.config.model, device=self.config.device, dtype=self.config.dtype
        )
        limit = policy.max_position_embeddings
        if self.config.max_model_len is not None and self.config.max_model_len > limit:
            raise ValueError(
                f"max_model_len {self.config.max_model_len} is larger than the model's "
                f"max_position_embeddings ({limit})"
            )
        self._policy = policy
        self._worker = Worker(
            policy,
            loop=asyncio.get_running_loop(),
            max_model_len=self.max_model_len,
            max_batch_size=self.config.max_batch_size,
            logprobs_mode=self.config.logprobs_mode,
            threads=self.config.threads,
            seed=self.config.seed,
            prompt_logprobs_chunk=self.config.prompt_logprobs_chunk,
            prefix_cache_bytes=self.config.prefix_cache_mib * 2**20,
        )
        self._worker.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()
            # The thread finishes its current step (milliseconds for small models), fails what is left, and exits.
            await asyncio.to_thread(worker.join)

    # ------------------------------------------------------------------ facts about the policy

    @property
    def policy(self) -> PolicyModel:
        if self._policy is None:
            raise EngineStopped("the engine is not running")
        return self._policy

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len or self.policy.max_position_embeddings

    @property
    def weight_version(self) -> int:
        return self._running().weight_version

    @property
    def is_paused(self) -> bool:
        return self._running().paused

    @property
    def active_requests(self) -> int:
        return self._running().active_requests

    @property
    def prefix_cache(self) -> PrefixCache:
        """The recent prompts' keys and values (`prefix_cache.py`): its `hits` and `reused_tokens` say what it saved."""
        return self._running().prefixes

    @property
    def peak_batch_size(self) -> int:
        """The most sequences decoded together since start."""
        return self._running().peak_batch_size

    # ------------------------------------------------------------------ generation

    def start(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationStream:
        """Queue a generation; read it with `stream.events()` or `stream.result()`, cancel it with `abort`."""
        stream = GenerationStream(GenerationRequest(prompt_ids=tuple(prompt_ids), params=params))
        self._running().submit(stream)
        return stream

    def abort(self, stream: GenerationStream) -> None:
        if self._worker is not None:
            self._worker.abort(stream)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        stream = self.start(prompt_ids, params)
        try:
            return await stream.result()
        except asyncio.CancelledError:
            self.abort(stream)
            raise

    # ------------------------------------------------------------------ pause and weights

    async def pause(self, mode: PauseMode = "abort") -> None:
        await asyncio.wrap_future(self._running().pause(mode))

    async def resume(self) -> None:
        await asyncio.wrap_future(self._running().resume())

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors into the live model between generation steps; return the new weight version.

        The tensors are read on the worker thread before this returns: do not change them until it has returned.
        Without a pause, requests in flight continue on the new weights (their earlier tokens keep the old ones).
        """
        return await asyncio.wrap_future(self._running().update_weights(list(named_tensors)))

    async def reload_weights(self, weights_path: str | Path) -> int:
        """Load every `*.safetensors` file of a directory into the live model; return the new weight version."""
        tensors = await asyncio.to_thread(read_safetensors_dir, weights_path)
        return await self.update_weights(tensors)

    def _running(self) -> Worker:
        if self._worker is None:
            raise EngineStopped("the engine is not running")
        return self._worker
