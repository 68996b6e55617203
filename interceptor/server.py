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

Errors are converted to OpenAI's shape in one middleware; input never causes a 500. The server owns "no reward
after a fault": a rollout whose last chat call failed upstream is finished `failed` (cause `upstream`) whatever
the driver asks, unless the driver says why it accepts it (`accept_upstream_failures`). With a record file, every
committed turn is journaled: a crash or a shutdown leaves the live rollouts as `interrupted` records.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

from aiohttp import web

from .admin import add_admin_routes
from .config import SamplingSettings, ServerConfig
from .dialects import Dialect, error_for
from .dialects.chat import CHAT
from .dialects.messages import MESSAGES
from .dialects.responses import RESPONSES
from .errors import BadRequest, ConfigError, Conflict, NotFound, errors_middleware_for, json_response
from .gate import HEAVY_REQUEST_BYTES, PARSE_OFF_LOOP_BYTES, Policy, run_turn
from .incoming import read_request, unseen_part
from .journal import Journal, journal_segments, recover_journal
from .protocol import ensure_serialisable, parse_json_body
from .records import Failure, RolloutRecord, RolloutStatus
from .recorder import Recorder
from .relay import relay_turn
from .relay_dialects import relay_shape_for
from .rendering import Renderer, RendererConfig
from .rollouts import Rollout, RolloutRegistry, RolloutView
from .streaming import stream_turn
from .trajectory import Trajectory
from .metrics import ServerMetrics
from .mounts import mount_under
from .replicas import ReplicaSet

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
    rollout.answer = rollout.scrub(body.get("answer", body))
    rollout.answered = True
    return {"ok": True, "message": "answer recorded"}


class InterceptionServer:
    def __init__(self, config: ServerConfig, *, host_tools: dict[str, HostTool] | None = None,
                 mounts: Sequence[tuple[str, web.Application]] = ()) -> None:
        self._mounts = tuple(mounts)  # (prefix, application) served on this port too: the viewer, in a Space
        self.config = config
        self.registry = RolloutRegistry()
        self.host_tools: dict[str, HostTool] = {"answer": _answer_tool, **(host_tools or {})}
        self.policy: Policy | None = None
        self._upstream = ReplicaSet(config.upstream)
        self.metrics = ServerMetrics(self)
        self._upstream.observe = lambda replica, seconds: self.metrics.upstream_seconds.labels(replica).observe(seconds)
        self._recorder: Recorder | None = None
        self._journal: Journal | None = None
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
        if self.config.record_path is not None:
            await self._open_records(self.config.record_path)
        if self.config.mode == "interception_gate":
            self.policy = await self._load_policy()
            self.policy.journal = self._journal
            self.policy.observe_turn = self.metrics.observe_turn
        app = web.Application(middlewares=[errors_middleware_for(error_for)], client_max_size=self.config.max_body_bytes)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self.metrics.route(self.config.admin_token))
        add_admin_routes(app, self)
        for dialect in (CHAT, MESSAGES, RESPONSES):
            app.router.add_post(f"/rollout/{{rid}}/v1/{dialect.path}", functools.partial(self._turn, dialect=dialect))
        app.router.add_post("/rollout/{rid}/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/rollout/{rid}/v1/models", self._models)
        app.router.add_post("/rollout/{rid}/v1/tools/{tool}", self._tool)
        for number, (prefix, mounted) in enumerate(self._mounts):  # the first one is the page at /
            mount_under(app, prefix, mounted, root=number == 0)
        # handler_cancellation=False: a turn whose agent hung up still finishes and is recorded (a retry replays it)
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=False, shutdown_timeout=self.config.shutdown_grace_s
        )
        await runner.setup()
        # Shutdown, in this order: stop taking requests (in-flight ones get the grace), then write every rollout
        # still live as `interrupted`, then close the journal (exit stack callbacks run in reverse).
        self._stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        self._port = runner.addresses[0][1]
        log.info("interception server (%s) on %s", self.config.mode, self.url)

    async def _open_records(self, path) -> None:
        """Open the record file (a torn last line is set aside), write the rollouts a crashed server left in its
        journal as `interrupted`, and start a new journal."""
        self._recorder = await asyncio.to_thread(Recorder, path)
        old_segments = journal_segments(path)
        if old_segments:
            recovered = await asyncio.to_thread(recover_journal, path)
            for record in recovered:
                await self._recorder.write(record)
            for segment in old_segments:
                segment.unlink()
            if recovered:
                log.warning("wrote %d rollouts left unfinished by an earlier run as interrupted", len(recovered))
        self._journal = Journal(path)
        self._stack.push_async_callback(self._close_records)

    async def _close_records(self) -> None:
        reason = "the server shut down before the rollout finished"
        complete = True
        for rollout in self.registry.live():
            if rollout.finishing:  # a driver is writing its record right now; the journal keeps it meanwhile
                complete = False
                continue
            try:
                await self.finish_rollout(rollout.id, status="interrupted",
                                          failure=Failure(cause="interrupted", message=reason))
            except Exception:  # one rollout's record must not stop the others'; it stays in the journal
                log.exception("could not write rollout %s at shutdown; it stays in the journal", rollout.id)
                complete = False
        self._journal.close(remove=complete)

    async def _load_policy(self) -> Policy:
        renderer = await asyncio.to_thread(
            Renderer,
            RendererConfig(
                model_dir=self.config.model_dir,
                chat_template=self.config.chat_template,
                training_template=self.config.training_template,
                tiktoken_twin=self.config.tiktoken_twin,
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
        if self._journal is not None:
            self._journal.opened(rollout_id=rollout.id, mode=rollout.mode, metadata=rollout.metadata,
                                 started_at=rollout.started_at)
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

    def rollout(self, rollout_id: str) -> RolloutView:
        """A read-only view of a live rollout (its answer, failures, activity), for drivers such as the runner."""
        return RolloutView(self.registry.get(rollout_id))

    async def finish_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus = "ok",
        failure: Failure | None = None,
        reward: float | None = None,
        accept_upstream_failures: str | None = None,
    ) -> RolloutRecord:
        """End a rollout: it takes no more requests, and its record is on disk before this returns.

        A rollout whose last chat call failed upstream is finished `failed` with cause `upstream` and no reward,
        whatever `status` says (infrastructure faults never become rewards), unless `accept_upstream_failures`
        says why the driver accepts it (kept in the record's events). If the record cannot be written, the
        rollout stays live and the error is raised: nothing is lost.
        """
        rollout = self.registry.get(rollout_id)
        if rollout.finishing:
            raise Conflict(f"rollout {rollout_id} is already finishing")
        rollout.finishing = True
        try:
            fault = rollout.failure
            if fault is not None and status == "ok" and failure is None:
                if accept_upstream_failures:
                    rollout.note("upstream_failures_accepted", reason=accept_upstream_failures,
                                 failure=fault.message)
                else:
                    status, failure = "failed", fault
            if status != "ok" and failure is None:
                failure = Failure(cause=status, message=f"rollout ended as {status}")
            record = rollout.to_record(status=status, failure=failure, reward=reward if status == "ok" else None,
                                       journal=self._journal)
            if self._recorder is not None:
                await self._recorder.write(record)
        except BaseException:
            rollout.finishing = False
            raise
        if self._journal is not None:
            self._journal.finished(rollout_id)
        self.registry.retire(rollout, status)
        self._upstream.release(rollout_id)
        self.metrics.rollouts_finished.labels(status, failure.cause if failure else "").inc()
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
        health = {"status": "ok", "mode": self.config.mode, "live_rollouts": len(self.registry)}
        if len(self._upstream.replicas) > 1:
            health["replicas"] = self._upstream.stats()
        return json_response(health)

    @property
    def replicas(self) -> ReplicaSet:
        """The policy servers this server generates with (one, or several replicas with sticky routing)."""
        return self._upstream

    def _authorize(self, request: web.Request, *, tools: bool = False, dialect: Dialect = CHAT) -> Rollout:
        return self.registry.authorize(request.match_info["rid"], dialect.authorization(request), tools=tools)

    async def _turn(self, request: web.Request, *, dialect: Dialect) -> web.StreamResponse:
        rollout = self._authorize(request, dialect=dialect)
        rollout.in_flight += 1
        try:
            response = await self._answer(request, rollout, dialect)
            self.metrics.turns.labels(self.config.mode, dialect.name).inc()
            return response
        finally:
            rollout.in_flight -= 1
            rollout.last_activity = time.monotonic()

    async def _answer(self, request: web.Request, rollout: Rollout, dialect: Dialect) -> web.StreamResponse:
        raw = await request.read()
        heavy = len(raw) > HEAVY_REQUEST_BYTES  # its work goes to a worker thread, so other rollouts go on
        relayed = self.policy is None
        cache = rollout.body_cache(dialect.name, dialect.history_key)
        if len(raw) > PARSE_OFF_LOOP_BYTES and not cache.extends_recent(raw):
            parsed, chat = await asyncio.to_thread(read_request, dialect, cache, raw, relayed)
        else:
            parsed, chat = read_request(dialect, cache, raw, relayed)
        cache.keep(parsed, chat)
        body = parsed.body
        if chat.ignored and not rollout.ignored_noted.issuperset(chat.ignored):
            rollout.ignored_noted.update(chat.ignored)
            rollout.note("ignored_request_fields", fields=list(chat.ignored))
        if relayed:
            ensure_serialisable(unseen_part(parsed, dialect.history_key), "body")  # it is recorded: it must serialise
            return await relay_turn(request, self._upstream, rollout, raw, body, chat, shape=relay_shape_for(dialect.name),
                                    journal=self._journal)  # fmt: skip
        attempts_key = parsed.fingerprint  # SDK retries resend the same bytes
        turn = run_turn(self.policy, rollout, chat, fingerprint=attempts_key, sdk_retry=_sdk_retry(request),
                        heavy=heavy)

        def delivered() -> None:
            attempts = rollout.attempts.get(attempts_key)
            if attempts is not None:
                attempts.delivered = True

        model = self.config.served_model_name
        if chat.stream:
            return await stream_turn(request, turn, dialect.stream(chat, model=model), hold_s=self.config.stream_hold_s,
                                     keepalive_s=self.config.keepalive_s, on_delivered=delivered)  # fmt: skip
        result = await turn
        response = json_response(dialect.reply(result, chat, model=model))
        await response.prepare(request)
        await response.write_eof()
        delivered()
        return response

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's `POST /v1/messages/count_tokens`, answered from the renderer: the prompt's token count."""
        self._authorize(request, dialect=MESSAGES)
        if self.policy is None:
            raise BadRequest("count_tokens needs the policy's tokenizer: it is answered in interception_gate mode")
        chat = MESSAGES.parse_for_count(parse_json_body(await request.read()))
        ids = await asyncio.to_thread(self.policy.renderer.render_full, chat.messages, chat.tools)
        return json_response({"input_tokens": len(ids)})

    async def _models(self, request: web.Request) -> web.Response:
        self._authorize(request)
        model = {"id": self.config.served_model_name, "object": "model", "owned_by": "interceptor"}
        if self.policy is not None:
            model["max_model_len"] = self.policy.max_model_len
        return json_response({"object": "list", "data": [model]})

    async def _tool(self, request: web.Request) -> web.Response:
        rollout = self._authorize(request, tools=True)
        name = request.match_info["tool"]
        tool = self.host_tools.get(name)
        if tool is None:
            raise NotFound(f"no host tool {name!r}; this rollout has {sorted(self.host_tools)}")
        raw = await request.read()
        body = parse_json_body(raw) if raw.strip() else {}
        ensure_serialisable(body, "body")  # it is recorded: nothing that parses may make the record unwritable
        rollout.note("tool_call", tool=name)
        answer = await tool(rollout, body)
        if name == "answer" and self._journal is not None:
            self._journal.answered(rollout.id, rollout.answer)
        return json_response(answer)


def _sdk_retry(request: web.Request) -> bool:
    """The OpenAI and Anthropic SDKs number their retries in `X-Stainless-Retry-Count` (0 on the first try)."""
    count = request.headers.get("X-Stainless-Retry-Count", "0")
    return count.isdigit() and int(count) > 0
