"""Answering a streamed request in interception_gate mode, in any dialect's events (`interceptor.wire.dialects`).

The upstream call is not streamed, so the whole answer exists at once. The status is held back for up to `hold_s`
(the SDKs wait minutes for headers: openai-python and the OpenAI Node SDK 10 minutes, undici 5): if the answer
or a failure comes by then, the response is an ordinary OpenAI stream, or an HTTP error status the agent's SDK
retries. If generation takes longer, the headers and the dialect's opening events go out (chat: the role delta;
Messages: `message_start`), then its keepalive every `keepalive_s` (chat: an SSE comment line, which openai-python,
the OpenAI Node SDK used by Pi, and the AI SDK's eventsource-parser used by OpenCode all skip; Messages: `ping`),
so no idle timeout closes the connection. A failure after the headers is sent as the dialect's error event, which
the SDKs raise and do not retry: hence the long hold.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from interceptor.errors import ApiError
from interceptor.rollouts import TurnResult

if TYPE_CHECKING:
    from interceptor.wire.dialects import StreamShape

__all__ = ["EventWriter", "SSE_HEADERS", "open_aiohttp_stream", "stream_turn"]

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventWriter(Protocol):
    """Where a stream's events go: aiohttp's `StreamResponse`, or the fast lane's `LaneStream`."""

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self) -> None: ...


async def open_aiohttp_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await response.prepare(request)
    return response


async def stream_turn(
    open_stream: Callable[[], Awaitable[EventWriter]],
    turn: Awaitable[TurnResult],
    shape: StreamShape,
    *,
    hold_s: float,
    keepalive_s: float,
    on_delivered: Callable[[], None],
) -> EventWriter:
    """Answer one streamed turn in `shape`'s events (a dialect's); `open_stream` sends the status and headers."""
    task = asyncio.ensure_future(turn)
    try:
        done, _ = await asyncio.wait({task}, timeout=hold_s)
        if done:
            result = task.result()  # raises ApiError before any header is sent: a plain error response
            response = await open_stream()
            await response.write(shape.events(result, opened=False))
            await response.write_eof()
            on_delivered()
            return response
        response = await open_stream()
        await response.write(shape.opening())
        while True:
            done, _ = await asyncio.wait({task}, timeout=keepalive_s)
            if done:
                break
            await response.write(shape.keepalive)
        try:
            result = task.result()
        except ApiError as exc:
            await response.write(shape.failure(exc))
            await response.write_eof()
            return response
        await response.write(shape.events(result, opened=True))
        await response.write_eof()
        on_delivered()
        return response
    except (ConnectionResetError, asyncio.CancelledError):
        # The agent went away. The turn itself runs to the end and is recorded, so a retry is answered from it.
        if not task.done():
            task.add_done_callback(_consume)
        raise
    finally:
        if task.done() and not task.cancelled():
            with contextlib.suppress(Exception):
                task.exception()


def _consume(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
