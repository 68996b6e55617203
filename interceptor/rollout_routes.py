"""A rollout's endpoints other than its turns: the model list, Anthropic's token count, and the host tools.

    GET  /rollout/{id}/v1/models                  the served model (and the policy's context length)
    POST /rollout/{id}/v1/messages/count_tokens   the prompt's token count, from the policy's renderer
    POST /rollout/{id}/v1/tools/{name}            a host tool; `answer` records the submission for the grader

Each is behind the rollout's credential (`tools/*` also takes its tools-only secret).
"""

from __future__ import annotations

import asyncio
import select
from typing import TYPE_CHECKING

from aiohttp import web

from interceptor.errors import BadRequest, NotFound, json_response
from interceptor.wire.dialects.messages import MESSAGES
from interceptor.wire.protocol import ensure_serialisable, parse_json_body
from interceptor.wire.request_body import read_body

if TYPE_CHECKING:
    from interceptor.server import InterceptionServer

__all__ = ["add_rollout_routes"]


def add_rollout_routes(app: web.Application, server: InterceptionServer) -> None:
    async def count_tokens(request: web.Request) -> web.Response:
        """Anthropic's `POST /v1/messages/count_tokens`, answered from the renderer: the prompt's token count."""
        server.authorize(request, dialect=MESSAGES)
        if server.policy is None:
            raise BadRequest("count_tokens needs the policy's tokenizer: it is answered in interception_gate mode")
        chat = MESSAGES.parse_for_count(parse_json_body(await read_body(request, server.body_limits)))
        # as JSON, made and dropped chunk by chunk in the thread: no list of every id comes back to the loop to free
        ids = await asyncio.to_thread(server.policy.renderer.render_full_json, chat.messages, chat.tools)
        return json_response({"input_tokens": ids.count})

    async def models(request: web.Request) -> web.Response:
        server.authorize(request)
        model = {"id": server.config.served_model_name, "object": "model", "owned_by": "interceptor"}
        if server.policy is not None:
            model["max_model_len"] = server.policy.max_model_len
        return json_response({"object": "list", "data": [model]})

    async def tool(request: web.Request) -> web.Response:
        rollout = server.authorize(request, tools=True)
        name = request.match_info["tool"]
        host_tool = server.host_tools.get(name)
        if host_tool is None:
            raise NotFound(f"no host tool {name!r}; this rollout has {sorted(server.host_tools)}")
        raw = await read_body(request, server.body_limits)
        body = parse_json_body(raw) if raw.strip() else {}
        ensure_serialisable(body, "body")  # it is recorded: nothing that parses may make the record unwritable
        rollout.note("tool_call", tool=name)
        rollout.tools_in_flight += 1
        try:
            answer = await host_tool(rollout, body)
        finally:
            rollout.tools_in_flight -= 1
        if name == "answer" and server.journal is not None:
            server.journal.answered(rollout.id, rollout.answer)
        if _caller_gone(request):  # the box gave up waiting for this reply: the server was too slow for it
            rollout.replies_lost += 1
            rollout.note("reply_lost", tool=name)
        return json_response(answer)

    app.router.add_post("/rollout/{rid}/v1/messages/count_tokens", count_tokens)
    app.router.add_get("/rollout/{rid}/v1/models", models)
    app.router.add_post("/rollout/{rid}/v1/tools/{tool}", tool)


def _caller_gone(request) -> bool:
    """Whether the client of `request` (aiohttp's or the fast lane's) has hung up, so its reply will be lost. A
    connection whose reading is paused (the lane holds one request at a time) learns of it only from the socket:
    POLLRDHUP, where Linux offers it."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(select, "POLLRDHUP"):
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLRDHUP)
    return bool(poller.poll(0))
