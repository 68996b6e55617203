"""`LocalEngine`: the engine and its HTTP server in this process, for a trainer that lives here too.

    async with LocalEngine(EngineConfig(model=DIR, port=0)) as engine:
        engine.base_url                      # http://127.0.0.1:<real port>, vLLM's /v1 API under it
        await engine.pause("wait")           # or "abort" / "keep", as vLLM's /pause
        version = await engine.update_weights(model.named_parameters())
        await engine.resume()

`update_weights` copies tensors into the live model between generation steps (no files, no HTTP) and bumps
`weight_version`; `reload_weights(DIR)` does the same from safetensors files, like `/collective_rpc`.
On exit the HTTP server stops first (in-flight requests get a short grace period, then are cancelled, which aborts
their generations), then the generation thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import torch

from trainer.engine.config import EngineConfig
from trainer.engine.core import EngineCore
from trainer.engine.generation import GenerationResult
from trainer.engine.http.server import EngineServer
from trainer.engine.sampling import SamplingParams
from trainer.engine.worker import PauseMode

__all__ = ["LocalEngine"]


class LocalEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._stack = AsyncExitStack()
        self._core: EngineCore | None = None
        self._server: EngineServer | None = None

    async def __aenter__(self) -> LocalEngine:
        async with AsyncExitStack() as stack:
            self._core = await stack.enter_async_context(EngineCore(self.config))
            self._server = await stack.enter_async_context(
                EngineServer(self._core, host=self.config.host, port=self.config.port)
            )
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    @property
    def core(self) -> EngineCore:
        if self._core is None:
            raise RuntimeError("LocalEngine is not started; use `async with LocalEngine(...)`")
        return self._core

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("LocalEngine is not started; use `async with LocalEngine(...)`")
        return self._server.base_url

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def weight_version(self) -> int:
        return self.core.weight_version

    @property
    def is_paused(self) -> bool:
        return self.core.is_paused

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        return await self.core.generate(prompt_ids, params)

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self.core.pause(mode)

    async def resume(self) -> None:
        await self.core.resume()

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        return await self.core.update_weights(named_tensors)

    async def reload_weights(self, weights_path: str | Path) -> int:
        return await self.core.reload_weights(weights_path)
