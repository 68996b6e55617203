"""Dialects: the wire protocols an agent may speak to its rollout endpoint, one module each.

    POST /rollout/<id>/v1/chat/completions    OpenAI chat completions (`chat`)
    POST /rollout/<id>/v1/messages            Anthropic Messages (`messages`), and /v1/messages/count_tokens
    POST /rollout/<id>/v1/responses           OpenAI Responses (`responses`), as Codex CLI speaks it

A dialect turns its request into the one `ChatRequest` the gate plans, generates and records (OpenAI-style
messages and function tools, which the chat template renders), and turns the `TurnResult` back into its own reply,
streamed or not, with its own error shape and credential header. The trajectory, forks, retry detection, journal,
recorder and fault handling are one code path for every dialect.

`registry.py` lists them: a new dialect is its module here, one entry there, its relay shape
(`interceptor/relay/shapes.py`) and its tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from interceptor.errors import ApiError
from interceptor.wire.protocol import ChatRequest

if TYPE_CHECKING:  # annotations only: importing rollouts brings the renderer (transformers, torch)
    from interceptor.rollouts import TurnResult

__all__ = ["Dialect", "StreamShape"]


class StreamShape(Protocol):
    """One streamed answer in a dialect's events. The gate's answer exists whole once generated; if it is not
    ready within the server's hold, `opening` goes out first, then `keepalive` until it is."""

    keepalive: bytes

    def opening(self) -> bytes: ...

    def events(self, result: TurnResult, *, opened: bool) -> bytes: ...  # the rest (all of it if not opened)

    def failure(self, error: ApiError) -> bytes: ...  # a failure after the headers went out


class Dialect(Protocol):
    name: str
    path: str  # the endpoint under /rollout/<id>/v1/
    history_key: str  # the body's field that holds the conversation (what `body_cache.py` reads incrementally)

    def authorization(self, request: web.Request) -> str | None:
        """The credential as `Bearer <secret>`, from whichever header this dialect's clients send."""
        ...

    def parse(self, body: dict, *, relayed: bool = False, continues: tuple[ChatRequest, int] | None = None) -> ChatRequest:
        """The request as the gate's ChatRequest; `relayed` (black_box): only what the trace reads is checked, the
        upstream honours or refuses the rest. `continues` (the request of an earlier body, and how many leading
        history elements this body shares with it, every other field being the same) lets a dialect read only the
        new elements; a dialect may ignore it."""
        ...

    def reply(self, result: TurnResult, chat: ChatRequest, *, model: str) -> dict: ...

    def stream(self, chat: ChatRequest, *, model: str) -> StreamShape: ...

    def error(self, error: ApiError) -> tuple[int, dict]:
        """Status and body of an error in this dialect's shape."""
        ...
