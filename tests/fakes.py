"""A scripted policy server with vLLM's /v1/completions contract, for tests that need to choose what the
"model" says (tool calls, length cuts, failures) and check every call the interceptor made.

It is a real aiohttp server on port 0. Each call pops the next scripted reply (text, or a fault), encodes it with
the model's real tokenizer, appends the end-of-turn token unless the reply is cut by length, and invents
logprobs. Every call is kept in `calls` as (prompt_ids, token_ids, logprobs) so tests can prove that each sampled
token was sampled given exactly the tokens before it.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web
from transformers import AutoTokenizer

__all__ = ["Call", "Fault", "ScriptedUpstream"]


@dataclass(frozen=True)
class Call:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    body: dict


@dataclass(frozen=True)
class Fault:
    status: int = 500
    delay_s: float = 0.0
    message: str = "injected fault"


@dataclass(frozen=True)
class Slow:
    text: str
    delay_s: float


class ScriptedUpstream:
    def __init__(self, model_dir: Path, *, max_model_len: int = 4096, default_reply: str = "ok") -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.end_of_turn = self.tokenizer.eos_token_id
        self.max_model_len = max_model_len
        self.default_reply = default_reply
        self.replies: deque = deque()
        self.routes: list[tuple[Callable[[str], bool], deque]] = []
        self.calls: list[Call] = []
        self._rng = random.Random(0)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def script(self, *replies) -> None:
        """Queue replies: a str (ends with the end-of-turn token), ("length", str) for a cut turn, a Fault, a Slow,
        or a function of the prompt (decoded) returning a str (a reply that quotes an id the agent sent)."""
        self.replies.extend(replies)

    def route(self, when: Callable[[str], bool], *replies) -> None:
        """Queue replies for the calls whose prompt (decoded) `when` accepts, such as a sub-agent's, whose turns
        interleave with its parent's. Routes are tried in the order they were added, then the plain queue."""
        self.routes.append((when, deque(replies)))

    def _next_reply(self, prompt: list[int]):
        """The next reply for this prompt; a function of the prompt is called with its text (decoded once)."""
        text = self.tokenizer.decode(prompt) if self.routes or (self.replies and callable(self.replies[0])) else ""
        reply = next((replies.popleft() for when, replies in self.routes if replies and when(text)), None)
        if reply is None:
            reply = self.replies.popleft() if self.replies else self.default_reply
        return reply(text) if callable(reply) else reply

    async def __aenter__(self) -> ScriptedUpstream:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "scripted", "object": "model", "max_model_len": self.max_model_len}]}
        )

    async def _completions(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        reply = self._next_reply(body["prompt"])
        if isinstance(reply, Fault):
            await asyncio.sleep(reply.delay_s)
            return web.json_response({"error": {"message": reply.message}}, status=reply.status)
        if isinstance(reply, Slow):
            await asyncio.sleep(reply.delay_s)
            reply = reply.text
        cut = isinstance(reply, tuple) and reply[0] == "length"
        text = reply[1] if cut else reply
        token_ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not cut:
            token_ids.append(self.end_of_turn)
        if len(token_ids) > body.get("max_tokens", len(token_ids)):  # as vLLM does: never more than asked for
            token_ids, cut = token_ids[: body["max_tokens"]], True
        logprobs = [-self._rng.uniform(0.01, 5.0) for _ in token_ids]
        self.calls.append(Call(list(body["prompt"]), token_ids, logprobs, body))
        choice = {
            "index": 0,
            "text": self.tokenizer.decode(token_ids, skip_special_tokens=True),
            "token_ids": token_ids,
            "prompt_token_ids": body["prompt"],
            "logprobs": {"token_logprobs": logprobs, "tokens": [], "text_offset": [], "top_logprobs": []},
            "finish_reason": "length" if cut else "stop",
            "stop_reason": None,
        }
        return web.json_response(
            {
                "id": "cmpl-scripted",
                "object": "text_completion",
                "model": "scripted",
                "choices": [choice],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(token_ids)},
            }
        )
