"""Answering a streamed chat request in interception_gate mode.

The upstream call is not streamed, so the whole answer exists at once. The status is held back for up to `hold_s`
(the SDKs wait minutes for headers: openai-python and the OpenAI Node SDK 10 minutes, undici 5): if the answer
or a failure comes by then, the response is an ordinary OpenAI stream, or an HTTP error status the agent's SDK
retries. If generation takes longer, the headers and the role delta go out, then an SSE comment line every
`keepalive_s` (`: keepalive`, which openai-python, the OpenAI Node SDK used by Pi, and the AI SDK's
eventsource-parser used by OpenCode all skip), so no idle timeout closes the connection. A failure after the
headers is sent as an `error` event, which the SDKs raise and do not retry: hence the long hold.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from .errors import ApiError, error_body
from .replies import SSE_DONE, Usage, chat_chunks, encode_sse
from .rollouts import TurnResult

__all__ = ["stream_turn", "SSE_HEADERS"]

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_KEEPALIVE = b": keepalive\n\n"


async def stream_turn(
    request: web.Request,
    turn: Awaitable[TurnResult],
    *,
    completion_id: str,
    model: str,
    include_usage: bool,
    hold_s: float,
    keepalive_s: float,
    on_delivered: Callable[[], None],
) -> web.StreamResponse:
    task = asyncio.ensure_future(turn)
    try:
        done, _ = await asyncio.wait({task}, timeout=hold_s)
        if done:
            result = task.result()  # raises ApiError before any header is sent: a plain error response
            response = await _open(request)
            await _write_result(response, result, completion_id, model, include_usage, role_sent=False)
            on_delivered()
            return response
        response = await _open(request)
        first = next(chat_chunks(completion_id=completion_id, model=model, message={}, finish_reason="stop", usage=None))
        await response.write(encode_sse(first))
        while True:
            done, _ = await asyncio.wait({task}, timeout=keepalive_s)
            if done:
                break
            await response.write(_KEEPALIVE)
        try:
            result = task.result()
        except ApiError as exc:
            await response.write(encode_sse(error_body(exc)) + SSE_DONE)
            await response.write_eof()
            return response
        await _write_result(response, result, completion_id, model, include_usage, role_sent=True)
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


async def _open(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await response.prepare(request)
    return response


async def _write_result(
    response: web.StreamResponse,
    result: TurnResult,
    completion_id: str,
    model: str,
    include_usage: bool,
    *,
    role_sent: bool,
) -> None:
    usage = Usage(result.prompt_tokens, result.completion_tokens) if include_usage else None
    chunks = chat_chunks(
        completion_id=completion_id,
        model=model,
        message=result.message,
        finish_reason=result.finish_reason,
        usage=usage,
        logprobs=result.logprobs,
    )
    if role_sent:
        next(chunks)
    await response.write(b"".join(encode_sse(c) for c in chunks) + SSE_DONE)
    await response.write_eof()


def _consume(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
