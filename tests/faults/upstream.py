"""A policy server that fails on purpose: vLLM's `/v1/completions` contract, one scripted behaviour per call.

It is a real aiohttp app on port 0, like `tests/fakes.py`'s ScriptedUpstream: a good reply is the scripted text
encoded with the model's real tokenizer, the end-of-turn token appended, with invented logprobs, and
`GET /v1/models` reports `max_model_len`. Every other behaviour is a fault a real upstream shows: an error
status, a connection dropped before, after or in the middle of the response (done on the socket, so aiohttp's
client sees a real reset or a real early close), a stall, or a 200 whose body breaks the contract.

    async with FaultUpstream(tokenizer) as upstream:
        upstream.script(Reply("hello"))        # the next call gets this
        upstream.then = Status(503)            # every call after the script is used up gets this
        upstream.attempts                      # calls received (completions and chat) so far
        upstream.authorizations                # the Authorization header each of them came with
        await upstream.refuse_connections()    # stop listening: the port now refuses connections

`/v1/chat/completions` answers from the same script (black_box mode): a `Reply` becomes an OpenAI chat
completion (a stream when the request asks for one); the faults behave as they do for completions.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import orjson
from aiohttp import web

from tests.fakes import Call

__all__ = ["Behaviour", "Body", "Drop", "FaultUpstream", "Mangled", "Reply", "Stall", "Status"]


@dataclass(frozen=True)
class Reply:
    """A good answer, after `delay_s`, sent with `content_type`."""

    text: str = "ok"
    delay_s: float = 0.0
    content_type: str = "application/json"


@dataclass(frozen=True)
class Status:
    """An HTTP error with an OpenAI-style error body."""

    status: int
    message: str = "injected fault"
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0


@dataclass(frozen=True)
class Drop:
    """The connection goes away: on `arrival` (no byte sent), after the `headers` (200, Content-Length promised,
    no body), or in the middle of the `body` (half of a good reply). `hard`: a TCP reset (SO_LINGER 0);
    otherwise an orderly close, which the client sees as a disconnect or a short body."""

    at: Literal["arrival", "headers", "body"]
    hard: bool = True
    delay_s: float = 0.0


@dataclass(frozen=True)
class Stall:
    """No answer at all for `seconds` (or until the server closes), then a reset."""

    seconds: float = 60.0
    delay_s: float = 0.0


@dataclass(frozen=True)
class Body:
    """A 200 with exactly these bytes."""

    raw: bytes
    content_type: str = "application/json"
    delay_s: float = 0.0


@dataclass(frozen=True)
class Mangled:
    """A good reply whose JSON is edited before it goes out. `edit` gets the response object and returns what to
    send; it is serialised with the standard `json` module, so NaN and Infinity go out as the raw tokens `NaN`
    and `Infinity` (which vLLM's Python JSON encoder can emit too)."""

    edit: Callable[[dict], object]
    text: str = "ok"
    delay_s: float = 0.0


Behaviour = Reply | Status | Drop | Stall | Body | Mangled

_LINGER_RESET = struct.pack("ii", 1, 0)  # close() then sends RST instead of FIN


class FaultUpstream:
    def __init__(self, tokenizer, *, max_model_len: int = 4096, model: str = "faulty") -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token_id
        self.max_model_len = max_model_len
        self.model = model
        self.replies: deque[Behaviour] = deque()
        self.then: Behaviour = Reply()
        self.attempts = 0  # requests received at /v1/completions and /v1/chat/completions
        self.calls: list[Call] = []  # good completions sent: what the policy "sampled", for token-exact checks
        self.authorizations: list[str | None] = []  # the Authorization header of each completion and chat request
        self.arrived = asyncio.Event()  # set on every request; tests clear it to wait for the next one
        self._rng = random.Random(0)
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next calls, in order; after them every call gets `then`."""
        self.replies.extend(behaviours)

    # ------------------------------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> FaultUpstream:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: a stalled handler ends when the interceptor gives up on it, not at clean-up
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.refuse_connections()

    async def refuse_connections(self) -> None:
        """Stop listening and close every connection: from now on the port refuses (an upstream that died)."""
        self._closing.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ------------------------------------------------------------------------------------------ handlers

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [model]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.append(request.headers.get("Authorization"))
        body = orjson.loads(await request.read())
        behaviour = self._next()
        if isinstance(behaviour, Reply):
            await asyncio.sleep(behaviour.delay_s)
            completion = self._completion(body, behaviour.text)
            sampled = completion["choices"][0]
            self.calls.append(Call(body["prompt"], sampled["token_ids"], sampled["logprobs"]["token_logprobs"], body))
            return web.Response(body=orjson.dumps(completion), content_type=behaviour.content_type)
        return await self._perform(request, behaviour, lambda text: self._completion(body, text))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.append(request.headers.get("Authorization"))
        body = orjson.loads(await request.read())
        behaviour = self._next()
        if isinstance(behaviour, Reply) and body.get("stream"):
            await asyncio.sleep(behaviour.delay_s)
            return await self._chat_stream(request, behaviour.text)
        return await self._perform(request, behaviour, lambda text: _chat_completion(text, self.model))

    def _next(self) -> Behaviour:
        self.attempts += 1
        self.arrived.set()
        return self.replies.popleft() if self.replies else self.then

    async def _perform(
        self, request: web.Request, behaviour: Behaviour, good: Callable[[str], dict]
    ) -> web.StreamResponse:
        await asyncio.sleep(behaviour.delay_s)
        match behaviour:
            case Reply(text=text, content_type=content_type):
                return web.Response(body=orjson.dumps(good(text)), content_type=content_type)
            case Status(status=status, message=message, headers=headers):
                error = {"error": {"message": message, "type": "upstream_fault", "param": None, "code": status}}
                return web.json_response(error, status=status, headers=dict(headers))
            case Body(raw=raw, content_type=content_type):
                return web.Response(body=raw, headers={"Content-Type": content_type})
            case Mangled(edit=edit, text=text):
                raw = json.dumps(edit(good(text))).encode()  # json, not orjson: NaN must go out as NaN
                return web.Response(body=raw, content_type="application/json")
            case Drop():
                return await self._drop(request, behaviour, orjson.dumps(good("this reply is cut short")))
            case Stall(seconds=seconds):
                try:
                    await asyncio.wait_for(self._closing.wait(), seconds)
                except TimeoutError:
                    pass
                _close(request, hard=True)
                return web.Response()
        raise AssertionError(f"unknown behaviour {behaviour!r}")

    async def _drop(self, request: web.Request, drop: Drop, full_body: bytes) -> web.StreamResponse:
        if drop.at == "arrival":
            _close(request, hard=drop.hard)
            return web.Response()  # never sent: the transport is gone
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Content-Length": str(len(full_body))}
        )
        await response.prepare(request)  # the status line and headers go out now
        if drop.at == "body":
            await response.write(full_body[: len(full_body) // 2])
        await asyncio.sleep(0.05)  # let the client read what was sent, so the drop comes after it
        _close(request, hard=drop.hard)
        return response

    # ------------------------------------------------------------------------------------------ replies

    def _completion(self, body: dict, text: str) -> dict:
        """vLLM's /v1/completions answer for `text`, as if sampled from the prompt (only a `Reply` is kept in
        `calls`: a mangled or cut-short answer was never the policy's)."""
        token_ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_of_turn]
        logprobs = [-self._rng.uniform(0.01, 5.0) for _ in token_ids]
        choice = {
            "index": 0,
            "text": text,
            "token_ids": token_ids,
            "prompt_token_ids": body["prompt"],
            "logprobs": {"token_logprobs": logprobs, "tokens": [], "text_offset": [], "top_logprobs": []},
            "finish_reason": "stop",
            "stop_reason": None,
        }
        return {
            "id": "cmpl-faulty",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(token_ids)},
        }

    async def _chat_stream(self, request: web.Request, text: str) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"id": "chatcmpl-faulty", "object": "chat.completion.chunk", "created": 0, "model": self.model}
        for delta, finish in (({"role": "assistant", "content": text}, None), ({}, "stop")):
            event = {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _chat_completion(text: str, model: str) -> dict:
    return {
        "id": "chatcmpl-faulty",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _close(request: web.Request, *, hard: bool) -> None:
    transport = request.transport
    if transport is None:
        return
    if hard:
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        transport.abort()
    else:
        transport.close()
