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
The rollout routes alone are also served on the box port (`box_port.py`), for boxes off this host's loopback.

The listening socket is the fast lane's (`lane.py`): it answers the gate's turns (`turns.py`), streamed or not,
and the JSON routes itself, and hands every other connection to aiohttp (`config.fast_lane=False`: aiohttp serves
all). Errors are answered in the client's shape in one place (`errors.error_answer`, for the middleware and the
lane); input never causes a 500. The server owns "no reward after a fault": a rollout whose last chat call failed
upstream is finished `failed` (cause `upstream`) whatever the driver asks, unless the driver says why it accepts it
(`accept_upstream_failures`). With a record file, every committed turn is journaled: a crash or a shutdown leaves
the live rollouts as `interrupted` records, each rollout written once. The server holds the record file alone: a
second server on it is refused at start (`record_lock.py`).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

from aiohttp import web

from interceptor.admin import add_admin_routes
from interceptor.box_port import BoxPort
from interceptor.config import SamplingSettings, ServerConfig
from interceptor.errors import ConfigError, Conflict, errors_middleware_for, json_response
from interceptor.gate.stop_rules import StopRule
from interceptor.gate.trajectory import Trajectory
from interceptor.gate.turn import Policy
from interceptor.metrics import ServerMetrics
from interceptor.mounts import mount_under
from interceptor.rollout_routes import add_rollout_routes
from interceptor.rollouts import Rollout, RolloutRegistry, RolloutView
from interceptor.store.journal import Journal, journal_segments, recover_journal
from interceptor.store.record_lock import hold_record_file
from interceptor.store.recorder import Recorder
from interceptor.store.records import Failure, RolloutRecord, RolloutStatus
from interceptor.tokens.rendering import Renderer, RendererConfig
from interceptor.transport.lane import Lane, LaneRequest
from interceptor.transport.lane_routes import LaneRoutes, from_aiohttp
from interceptor.transport.replicas import ReplicaSet
from interceptor.turns import Turns, lane_error
from interceptor.wire.body_budget import BodyBudget
from interceptor.wire.dialects import Dialect
from interceptor.wire.dialects.chat import CHAT
from interceptor.wire.dialects.registry import DIALECTS, error_for
from interceptor.wire.request_body import BodyLimits

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


_heap_freezes = 0  # servers of this process that keep the start-up heap frozen; the last one out unfreezes it


def _freeze_heap() -> Callable[[], None]:
    """`gc.freeze()` now; what undoes it once no other server of the process still wants it."""
    global _heap_freezes
    gc.freeze()
    _heap_freezes += 1

    def thaw() -> None:
        global _heap_freezes
        _heap_freezes -= 1
        if _heap_freezes == 0:
            gc.unfreeze()

    return thaw


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
        self._box_port: BoxPort | None = None
        self.lane: Lane | None = None  # the fast lane (`lane.py`), when `config.fast_lane`
        # Every handler reads a body within these; the budget of bodies in flight is the lane's too (`request_body.py`)
        self.body_limits = BodyLimits(max_bytes=config.max_body_bytes, timeout_s=config.body_timeout_s,
                                      budget=BodyBudget(limit_bytes=config.max_pending_body_bytes))

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
            if self.config.gil_switch_interval_s is not None:  # the loop waits less for a thread's render
                self._stack.callback(sys.setswitchinterval, sys.getswitchinterval())
                sys.setswitchinterval(self.config.gil_switch_interval_s)
        app = web.Application(middlewares=[errors_middleware_for(error_for)], client_max_size=self.config.max_body_bytes)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self.metrics.route(self.config.admin_token))
        add_admin_routes(app, self)
        turns = Turns(self)
        for dialect in DIALECTS:
            app.router.add_post(f"/rollout/{{rid}}/v1/{dialect.path}", turns.aiohttp_handler(dialect))
        add_rollout_routes(app, self)
        for number, (prefix, mounted) in enumerate(self._mounts):  # the first one is the page at /
            mount_under(app, prefix, mounted, root=number == 0)
        # handler_cancellation=False: a turn whose agent hung up still finishes and is recorded (a retry replays it).
        # auto_decompress=False: handlers undo a body's Content-Encoding themselves (`request_body.py`), so a bad one
        # is an error in the client's shape, not a failure inside aiohttp's parser that drops the connection.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=False, shutdown_timeout=self.config.shutdown_grace_s,
            auto_decompress=False,
        )
        await runner.setup()
        # Shutdown, in this order: stop taking requests (in-flight ones get the grace), then write every rollout
        # still live as `interrupted`, then close the journal (exit stack callbacks run in reverse).
        self._stack.push_async_callback(runner.cleanup)
        if self.config.fast_lane:  # the gate's turns and the JSON routes off the socket, the rest aiohttp's
            self.lane = await Lane.start(runner.server, host=self.config.host, port=self.config.port,
                                         take=self._lane_routes(app, turns).take, on_error=lane_error,
                                         max_body_bytes=self.config.max_body_bytes, budget=self.body_limits.budget)
            self._stack.push_async_callback(self.lane.aclose, self.config.shutdown_grace_s)
            self._port = self.lane.port
        else:
            site = web.TCPSite(runner, self.config.host, self.config.port)
            await site.start()
            self._port = runner.addresses[0][1]
        self._box_port = BoxPort(self, turns)
        self._stack.push_async_callback(self._box_port.aclose)
        await self._box_port.start()
        if self.config.gc_freeze:  # start-up is over: the libraries, the tokenizer and the template are in the heap
            self._stack.callback(_freeze_heap())
        log.info("interception server (%s) on %s", self.config.mode, self.url)

    def _lane_routes(self, app: web.Application, turns: Turns) -> LaneRoutes:
        """What the fast lane answers (`lane.py`): the gate's turns, and the routes that answer JSON in one piece.
        black_box turns (the relay streams the upstream's events), /metrics and mounted pages stay with aiohttp."""
        routes = LaneRoutes()
        for route in app.router.routes():
            path = route.resource.canonical if route.resource is not None else None
            if path in _LANE_ROUTES and route.method in ("GET", "POST"):
                routes.add(route.method, path, from_aiohttp(route.handler))
        if self.policy is not None:
            for dialect in DIALECTS:
                routes.add("POST", f"/rollout/{{rid}}/v1/{dialect.path}", turns.lane_handler(dialect))
        return routes

    async def _open_records(self, path) -> None:
        """Take the record file (one server per file, `record_lock.py`), open it (a torn last line is set aside),
        write the rollouts a crashed server left in its journal as `interrupted` (those not already in the file),
        and start a new journal."""
        # First, before the file or the journal is touched; released last, once shutdown's records are written.
        self._stack.callback(hold_record_file(path).release)
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
                suffix_writer=self.config.suffix_writer,
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

    @property
    def box_port(self) -> BoxPort:
        """The rollout routes alone, on addresses boxes off this host's loopback reach (`box_port.py`)."""
        if self._box_port is None:
            raise RuntimeError("the server is not running")
        return self._box_port

    # ------------------------------------------------------------------------------------ Python API

    def open_rollout(self, *, sampling: SamplingSettings | None = None, metadata: dict | None = None,
                     stop_rules: tuple[StopRule, ...] = ()) -> RolloutHandle:
        """`stop_rules`: the gate stops the rollout before its agent gets a sampled call one of them matches."""
        trajectory = None
        if self.policy is not None:
            trajectory = Trajectory(self.policy.renderer, stop_ids=self._stop_ids)
        rollout = self.registry.create(mode=self.config.mode, sampling=sampling or SamplingSettings(),
                                       metadata=metadata or {}, trajectory=trajectory)  # fmt: skip
        rollout.stop_rules = stop_rules
        if self._journal is not None:
            self._journal.opened(rollout_id=rollout.id, mode=rollout.mode, metadata=rollout.metadata,
                                 started_at=rollout.started_at)
        return RolloutHandle(
            id=rollout.id,
            base_url=f"{self.url}/rollout/{rollout.id}/v1",
            secret=rollout.secret,
            tools_secret=rollout.tools_secret,
        )

    @functools.cached_property
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

    async def finish_rollout(self, rollout_id: str, *, status: RolloutStatus = "ok", failure: Failure | None = None,
                             reward: float | None = None, accept_upstream_failures: str | None = None) -> RolloutRecord:  # fmt: skip
        """End a rollout: it takes no more requests, and its record is on disk before this returns (`finish`)."""
        record, _ = await self.finish(rollout_id, status=status, failure=failure, reward=reward,
                                      accept_upstream_failures=accept_upstream_failures)
        return record

    async def finish(self, rollout_id: str, *, status: RolloutStatus = "ok", failure: Failure | None = None,
                     reward: float | None = None, accept_upstream_failures: str | None = None,
                     ) -> tuple[RolloutRecord, bytes | None]:  # fmt: skip
        """End a rollout: it takes no more requests, and its record is on disk before this returns. The record,
        and its JSON as the record file holds it (serialised once: the admin API answers with those bytes), None
        for a server without a record file.

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
                if accept_upstream_failures and fault.cause == "upstream":
                    rollout.note("upstream_failures_accepted", reason=accept_upstream_failures,
                                 failure=fault.message)
                else:
                    status, failure = "failed", fault
            if status != "ok" and failure is None:
                failure = Failure(cause=status, message=f"rollout ended as {status}")
            record = rollout.to_record(status=status, failure=failure, reward=reward if status == "ok" else None,
                                       journal=self._journal)
            line = None
            if self._recorder is not None:
                line = record.to_json()
                await self._recorder.write_line(line)
        except BaseException:
            rollout.finishing = False
            raise
        if self._journal is not None:
            self._journal.finished(rollout_id)
        self.registry.retire(rollout, status)
        self._upstream.release(rollout_id)
        self.metrics.rollouts_finished.labels(status, failure.cause if failure else "").inc()
        self.metrics.observe_events(rollout.events)
        return record, line

    async def pause(self) -> None:
        """New turns wait (agents see a slow answer, not an error) until `resume`, e.g. during a weight update."""
        if self.policy is not None:
            self.policy.ready.clear()
            self.policy.syncs_begun += 1

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

    @property
    def journal(self) -> Journal | None:
        return self._journal

    def authorize(self, request: web.Request | LaneRequest, *, tools: bool = False, dialect: Dialect = CHAT) -> Rollout:
        return self.registry.authorize(request.match_info["rid"], dialect.authorization(request), tools=tools)


# The routes whose handlers read only headers, path parameters and the body, and answer JSON in one piece.
_LANE_ROUTES = frozenset({"/health", "/rollouts", "/rollouts/{rid}", "/rollouts/{rid}/finish", "/rollout/{rid}/v1/models",
                          "/rollout/{rid}/v1/messages/count_tokens", "/rollout/{rid}/v1/tools/{tool}"})
