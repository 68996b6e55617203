"""One request's generation as the event loop sees it: what was asked, the events the worker sends, the result.

The worker thread never touches asyncio objects directly: it hands events to the loop with
`call_soon_threadsafe`, and the loop puts them on the request's queue. A stream ends with exactly one `Finish`
(or an exception, when the model failed or the engine stopped).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from trainer.engine.errors import EngineError
from trainer.engine.logprobs import TokenLogprob
from trainer.engine.sampling import SamplingParams

__all__ = [
    "Finish",
    "GenerationRequest",
    "GenerationResult",
    "GenerationStream",
    "PromptLogprobs",
    "TokenUpdate",
]


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    entries: tuple[TokenLogprob | None, ...]  # one per prompt position; the first is None (nothing precedes it)


@dataclass(frozen=True, slots=True)
class TokenUpdate:
    token_id: int
    logprob: TokenLogprob | None  # present when the request asked for logprobs


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str  # "stop" | "length" | "abort"
    stop_reason: int | None  # the stop_token_ids entry that ended it; None for the tokenizer's eos and the rest
    weight_version: int  # of the weights that sampled the last token


@dataclass(frozen=True, kw_only=True)
class GenerationResult:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None
    finish_reason: str
    stop_reason: int | None
    stopped_on_token: bool  # the last token is the eos or stop token that ended it (kept in token_ids, not text)
    weight_version: int  # of the weights that sampled the last token (earlier ones too, unless weights changed
    # mid-generation without a pause)


class GenerationStream:
    def __init__(self, request: GenerationRequest) -> None:
        self.request = request
        self._queue: asyncio.Queue[PromptLogprobs | TokenUpdate | Finish | EngineError] = asyncio.Queue()

    def deliver(self, event: PromptLogprobs | TokenUpdate | Finish | EngineError) -> None:
        """Called on the event loop's thread."""
        self._queue.put_nowait(event)

    async def events(self) -> AsyncIterator[PromptLogprobs | TokenUpdate | Finish]:
        while True:
            event = await self._queue.get()
            if isinstance(event, EngineError):
                raise event
            yield event
            if isinstance(event, Finish):
                return

    async def result(self) -> GenerationResult:
        token_ids: list[int] = []
        logprobs: list[TokenLogprob] = []
        prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        async for event in self.events():
            if isinstance(event, PromptLogprobs):
                prompt_logprobs = event.entries
            elif isinstance(event, TokenUpdate):
                token_ids.append(event.token_id)
                if event.logprob is not None:
                    logprobs.append(event.logprob)
            else:
                return GenerationResult(
                    prompt_ids=self.request.prompt_ids,
                    token_ids=tuple(token_ids),
                    logprobs=tuple(logprobs) if self.request.params.logprobs is not None else None,
                    prompt_logprobs=prompt_logprobs,
                    finish_reason=event.reason,
                    stop_reason=event.stop_reason,
                    stopped_on_token=event.reason == "stop",
                    weight_version=event.weight_version,
                )
        raise AssertionError("a generation stream ended without a Finish")
