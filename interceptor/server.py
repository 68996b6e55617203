"""`InterceptionServer`: the OpenAI-compatible endpoint every agent talks to, one base URL per rollout.

    async with InterceptionServer(config) as server:
        rollout = server.open_rollout(sampling=SamplingSettings(temperature=1.0))
        # give the agent rollout.base_url and rollout.secret; it chats; it calls tools/answer
        record = await server.finish_rollout(rollout.id)      # on disk before this returns

Routes (per rollout, behind `Authorization: Bearer <secret>`):
    POST /rollout/{id}/v1/chat/completions    a turn (interception_gate: token-level; black_box: relayed)
    GET  /rollout/{id}/v1/models              the served model
    POST /rollout/{id}/v1/tools/{name}        host tools; `answer` records the submission for the grader
Admin (behind the admin token): POST /rollouts, GET /rollouts/{id}, POST /rollouts/{id}/finish. And GET /health.

Errors are converted to OpenAI's shape in one middleware; input never causes a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import orjson
from aiohttp import web

from .admin import add_admin_routes
from .config import SamplingSettings, ServerConfig
from .errors import ApiError, BadRequest, ConfigError, NotFound, PayloadTooLarge, error_body
from .gate import Policy, run_turn
from .protocol import Usage, chat_completion, new_completion_id, parse_chat_request, parse_json_body
from .records import Failure, RolloutRecord, RolloutStatus
from .recorder import Recorder
from .relay import relay_chat
from .rendering import Renderer, RendererConfig
from .rollouts import Rollout, RolloutRegistry
from .streaming import stream_turn
from .trajectory import Trajectory
from .upstream import UpstreamClient

__all__ = ["InterceptionServer", "RolloutHandle", "HostTool"]

log = logging.getLogger("interceptor.server")

# A host tool: (rollout, JSON body) -> JSON answer for the agent. It must never reveal a reward.
HostTool = Callable[[Rollout, dict], Awaitable[dict]]


@dataclass(frozen=True, slots=True)
class RolloutHandle:
    id: str
    base_url: str
    secret: str = ""  # the agent's API key for this rollout (excluded from repr below)
    tools_secret: str = ""  # opens only /tools/*: for an `answer` command run by the agent's tools

    def __repr__(self) -> str:
        return f"RolloutHandle(id={self.id!r}, base_url={self.base_url!r})"


async def _answer_tool(rollout: Rollout, body: dict) -> dict:
    rollout.answer = body.get("answer", body)
    rollout.answered = True
    return {"ok": True, "message": "answer recorded"}


def _json(data: object, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


@web.middleware
async def _errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    """The one place errors become responses."""
    try:
        return await handler(request)
    except ApiError as exc:
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        return _json(error_body(exc), status=exc.status, headers=headers)
    except web.HTTPRequestEntityTooLarge as exc:
        return _json(error_body(PayloadTooLarge(f"request body too large: {exc.text}")), status=413)
    except web.HTTPException as exc:  # router-level 404/405
        if exc.status < 400:
            raise
        error = NotFound(f"{request.method} {request.path} is not an endpoint here")
        if exc.status != 404:
            error = BadRequest(f"{request.method} is not allowed on {request.path}")
        return _json(error_body(error), status=exc.status)


class InterceptionServer:
    def __init__(self, config: ServerConfig, *, host_tools: dict[str, HostTool] | None = None) -> None:
        self.config = config
        self.registry = RolloutRegistry()
        self.host_tools: dict[str, HostTool] = {"answer": _answer_tool, **(host_tools or {})}
        self.policy: Policy | None = None
        self._upstream = UpstreamClient(config.upstream)
        self._recorder = Recorder(config.record_path) if config.record_path else None
        self._stack = AsyncExitStack()
        self._port: int | None = None

    # ------------------------------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> InterceptionServer:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()  # undo a half-finished start
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._stack.aclose()

    async def _start(self) -> None:
        await self._stack.enter_async_context(self._upstream)
        if self.config.mode == "interception_gate":
            self.policy = await self._load_policy()
        app = web.Application(middlewares=[_errors_middleware], client_max_size=self.config.max_body_bytes)
        app.router.add_get("/health", self._health)
        add_admin_routes(app, self)
        app.router.add_post("/rollout/{rid}/v1/chat/completions", self._chat)
        app.router.add_get("/rollout/{rid}/v1/models", self._models)
        app.router.add_post("/rollout/{rid}/v1/tools/{tool}", self._tool)
        # handler_cancellation=False: a turn whose agent hung up still finishes and is recorded (a retry replays it)
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=False, shutdown_timeout=self.config.shutdown_grace_s
        )
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        self._port = runner.addresses[0][1]
        log.info("interception server (%s) on %s", self.config.mode, self.url)

    async def _load_policy(self) -> Policy:
        renderer = await asyncio.to_thread(
            Renderer,
            RendererConfig(
                model_dir=self.config.model_dir,
                chat_template=self.config.chat_template,
                training_template=self.config.training_template,
            ),
        )
        upstream_model = self.config.upstream.model
        max_model_len = self.config.max_model_len
        if upstream_model is None or max_model_len is None:
            models = await self._upstream.models()
            if not models:
                raise ConfigError("the policy server lists no model")
            upstream_model = upstream_model or models[0]["id"]
            max_model_len = max_model_len or int(models[0].get("max_model_len") or 0) or None
        if max_model_len is None:
            raise ConfigError("the policy server does not report max_model_len; set it in the configuration")
        return Policy(
            renderer=renderer,
            upstream=self._upstream,
            upstream_model=upstream_model,
            max_model_len=max_model_len,
            default_max_tokens=self.config.default_max_tokens,
        )

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the server is not running")
        return f"http://{self.config.public_host or self.config.host}:{self._port}"

    # ------------------------------------------------------------------------------------ Python API

    def open_rollout(
        self, *, sampling: SamplingSettings | None = None, metadata: dict | None = None
    ) -> RolloutHandle:
        trajectory = None
        if self.policy is not None:
            trajectory = Trajectory(self.policy.renderer, stop_ids=self._stop_ids())
        rollout = self.registry.create(
            mode=self.config.mode,
            sampling=sampling or SamplingSettings(),
            metadata=metadata or {},
            trajectory=trajectory,
        )
        return RolloutHandle(
            id=rollout.id,
            base_url=f"{self.url}/rollout/{rollout.id}/v1",
            secret=rollout.secret,
            tools_secret=rollout.tools_secret,
        )

    def _stop_ids(self) -> frozenset[int]:
        assert self.policy is not None
        tokenizer = self.policy.renderer.tokenizer
        ids = {self.policy.renderer.end_of_turn_id}
        if tokenizer.pad_token_id is not None and tokenizer.pad_token == "<|endoftext|>":
            ids.add(tokenizer.pad_token_id)  # Qwen's generation_config also stops on <|endoftext|>
        return frozenset(ids)

    def rollout(self, rollout_id: str) -> Rollout:
        return self.registry.get(rollout_id)

    async def finish_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus = "ok",
        failure: Failure | None = None,
        reward: float | None = None,
    ) -> RolloutRecord:
        """End a rollout: it takes no more requests, and its record is on disk before this returns.

        A rollout whose turns hit upstream failures and never produced a sample is marked failed (cause
        `upstream`), whatever `status` says: infrastructure faults never become rewards.
        """
        rollout = self.registry.get(rollout_id)
        if status == "ok" and failure is None and rollout.upstream_failures and not rollout.trace:
            status, failure = "failed", Failure(cause="upstream", message="every turn failed upstream")
        if status != "ok" and failure is None:
            failure = Failure(cause=status, message=f"rollout ended as {status}")
        self.registry.retire(rollout, status)
        record = rollout.to_record(status=status, failure=failure, reward=reward if status == "ok" else None)
        if self._recorder is not None:
            await self._recorder.write(record)
        return record

    async def pause(self) -> None:
        """New turns wait (agents see a slow answer, not an error) until `resume`, e.g. during a weight update."""
        if self.policy is not None:
            self.policy.ready.clear()

    async def resume(self, *, policy_version: int | None = None) -> None:
        if self.policy is not None:
            if policy_version is not None:
                self.policy.version = policy_version
            self.policy.ready.set()

    # -------------------------------------------------------------------------------------- handlers

    async def _health(self, request: web.Request) -> web.Response:
        return _json({"status": "ok", "mode": self.config.mode, "live_rollouts": len(self.registry)})

    def _authorize(self, request: web.Request, *, tools: bool = False) -> Rollout:
        return self.registry.authorize(request.match_info["rid"], request.headers.get("Authorization"), tools=tools)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        rollout = self._authorize(request)
        rollout.in_flight += 1
        try:
            return await self._answer_chat(request, rollout)
        finally:
            rollout.in_flight -= 1
            rollout.last_activity = time.monotonic()

    async def _answer_chat(self, request: web.Request, rollout: Rollout) -> web.StreamResponse:
        raw = await request.read()
        body = parse_json_body(raw)
        chat = parse_chat_request(body)
        if self.policy is None:
            return await relay_chat(request, self._upstream, rollout, body, chat)
        turn = run_turn(self.policy, rollout, chat, fingerprint=hash(raw))  # SDK retries resend the same bytes
        completion_id = new_completion_id()
        model = self.config.served_model_name
        if chat.stream:
            return await stream_turn(
                request,
                turn,
                completion_id=completion_id,
                model=model,
                include_usage=chat.include_usage,
                keepalive_s=self.config.keepalive_s,
            )
        result = await turn
        return _json(
            chat_completion(
                completion_id=completion_id,
                model=model,
                message=result.message,
                finish_reason=result.finish_reason,
                usage=Usage(result.prompt_tokens, result.completion_tokens),
            )
        )

    async def _models(self, request: web.Request) -> web.Response:
        self._authorize(request)
        model = {"id": self.config.served_model_name, "object": "model", "owned_by": "interceptor"}
        if self.policy is not None:
            model["max_model_len"] = self.policy.max_model_len
        return _json({"object": "list", "data": [model]})

    async def _tool(self, request: web.Request) -> web.Response:
        rollout = self._authorize(request, tools=True)
        name = request.match_info["tool"]
        tool = self.host_tools.get(name)
        if tool is None:
            raise NotFound(f"no host tool {name!r}; this rollout has {sorted(self.host_tools)}")
        raw = await request.read()
        body = parse_json_body(raw) if raw.strip() else {}
        rollout.note("tool_call", tool=name)
        return _json(await tool(rollout, body))
