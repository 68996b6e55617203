"""Run rollouts: one task, a group of N for one task, or a task file, each rollout in its own sandbox.

    async with InterceptionServer(config) as server:
        runner = Runner(server, RunnerConfig(agent=PiAgent(), sampling=SamplingSettings(temperature=1.0)))
        records = await runner.run_tasks(load_tasks("tasks.jsonl"), n=4)

One rollout: open it on the server -> make the sandbox (task files, setup commands run inside it, the `answer`
command) -> start the agent with its own rollout URL and secret -> wait for it under the task's wall-clock and
idle limits (idle = no request reaches the server) -> grade (the answer on the host; test commands inside the
sandbox) -> finish the rollout (on disk before it is reported).

The sandbox: `RunnerConfig.sandbox`, a custom factory; else the backend `RunnerConfig.backend` chooses
(`agents.sandbox.backends`): under `auto`, for a task with an `image` a `DockerSandbox` of that image (a task whose
image cannot be run fails with cause `sandbox`: it is never run somewhere else), else a `NamespaceSandbox` reaching
only the server where this machine can make one (Linux with bubblewrap), else a `LocalSandbox` (same user, no
isolation: a warning says so). Used as `async with Runner(...) as runner:`, sandboxes come from a warm pool
(`RunnerConfig.pool`, `agents.sandbox.pool`): made, entered and with their first process started before a rollout
asks, so its agent starts at once; a runner used without `async with` makes each sandbox when it is needed.

A driver (`RunnerConfig.driver`, a `RolloutDriver`) may run each attempt instead, in boxes of its own: Harbor's trials
(`agents.harbor.driver`); opening, finishing and recording the rollout stay here.

A rollout ends `ok` (graded: it has a reward), `timeout`, or `failed` with a cause: `agent` (crashed, not
installed), `sandbox` (set-up failed), `limit` (ended for going past a limit of its sandbox: disk), `upstream`
(its last chat call failed upstream), `overload` (it exited after this server answered its box too late),
`grader` (the grader could not decide), `cancelled`. Only `ok` rollouts carry a reward: an infrastructure fault never turns into one.
Cancelling (Ctrl-C) stops the agents and still writes every record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Protocol
from pathlib import Path
from urllib.parse import urlsplit

from interceptor.config import SamplingSettings
from interceptor.errors import BadRequest
from interceptor.gate.stop_rules import parse_stop_rules
from interceptor.server import InterceptionServer, RolloutHandle
from interceptor.store.records import Failure, RolloutRecord

from agents.answer_command import answer_command
from agents.errors import AgentConfigError, AgentError, RolloutFailed
from agents.graders import GRADER_PATHS, Grade, GraderFailed, grade_box
from agents.grading.fresh import Captured, baseline, capture, grade_fresh, graded_fresh, tampering_event
from agents.sandbox.backends import CHOICES, BoxChooser, Placement
from agents.sandbox.base import RunLimits, RunResult, Sandbox
from agents.sandbox.breaker import BreakerConfig, CircuitBreaker
from agents.sandbox.cgroups import ResourceLimits
from agents.sandbox.pool import PoolConfig, SandboxPool
from agents.specs.spec import AgentRollout, AgentSpec
from agents.tasks import Task
from agents.workspace import SetupFailed, prepare_workspace

__all__ = ["Runner", "RunnerConfig", "placement_for"]

log = logging.getLogger("agents.runner")

_OUTPUT_KEPT = 4000  # characters of the agent's output tail kept in a failed rollout's record


@dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    agent: AgentSpec | None = None  # the agent the runner's own boxes run (with a driver: the driver's)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    concurrency: int = 4  # rollouts running at once
    backend: str = "auto"  # the sandbox backend, as `--sandbox` names it (agents.sandbox.backends.CHOICES)
    sandbox: Callable[[], Sandbox] | None = None  # a custom factory for every task, in place of `backend`
    setup_timeout_s: float = 300.0
    breaker: BreakerConfig = field(default_factory=BreakerConfig)  # pauses a sandbox backend that keeps failing
    resources: ResourceLimits | None = None  # per-rollout CPU/memory/pids limits of the default backends
    pool: PoolConfig = field(default_factory=PoolConfig)  # prepared sandboxes per kind (under `async with` only)
    stop_rules: tuple[dict, ...] = ()  # every task's, besides its own (`agents.tasks.Task.stop_rules`)
    driver: RolloutDriver | None = None  # runs each attempt in place of this runner's boxes (Harbor's trials)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.sandbox is not None and self.resources is not None and self.resources.any:
            raise AgentConfigError("resources apply to the runner's own backends: give a custom sandbox its own limits")
        if self.backend not in CHOICES:
            raise AgentConfigError(f"backend must be one of {', '.join(CHOICES)}, not {self.backend!r}")
        try:
            parse_stop_rules(list(self.stop_rules))
        except BadRequest as exc:
            raise AgentConfigError(f"stop_rules: {exc.message}") from exc
        if (self.agent is None) == (self.driver is None):
            raise AgentConfigError("give the runner an agent spec to run in its boxes, or a driver (not both)")
        if self.driver is not None and self.sandbox is not None:
            raise AgentConfigError("a driver runs the rollouts in its own boxes: a custom sandbox would not be used")
        if self.sandbox is not None and self.backend != "auto":
            raise AgentConfigError(f"a custom sandbox runs every task: backend {self.backend!r} would not be used")


class RolloutDriver(Protocol):
    """What runs a rollout's attempt in place of the runner's own boxes (`agents.harbor.driver.HarborDriver`): the
    agent against `handle`'s URL and secret, then its grade as (reward, detail), or RolloutFailed with the cause."""

    name: str  # what the records name as the rollout's agent

    async def attempt(self, server: InterceptionServer, task: Task, handle: RolloutHandle) -> tuple[float, str]: ...


class Runner:
    def __init__(
        self,
        server: InterceptionServer,
        config: RunnerConfig,
        *,
        on_finished: Callable[[RolloutRecord], Awaitable[None] | None] | None = None,
    ) -> None:
        self.server = server
        self.config = config
        self._slots = asyncio.Semaphore(config.concurrency)
        self._on_finished = on_finished
        self._agent_paths: tuple[Path, ...] = ()  # what the agent's launches ran from (a warm sandbox binds it)
        self._boxes = None if config.sandbox is not None else BoxChooser(config.backend, placement_for(
            server, resources=config.resources, warm_paths=lambda: (*self._agent_paths, *GRADER_PATHS)))
        # One circuit per backend: the default one, and each task image's (a broken image pauses only its tasks)
        self._breakers: dict[str | None, CircuitBreaker] = {None: CircuitBreaker(config.breaker)}
        self._pool = SandboxPool(config.pool)

    async def __aenter__(self) -> Runner:
        await self._pool.__aenter__()
        if self.config.driver is not None:  # its boxes are its own: none to warm
            return self
        kind, make = self._sandbox_for(None)
        await self._pool.prefill(kind, make)
        return self

    @property
    def _agent_name(self) -> str:
        return self.config.driver.name if self.config.driver is not None else self.config.agent.name

    async def __aexit__(self, *exc_info: object) -> None:
        await self._pool.__aexit__(*exc_info)

    @property
    def pool(self) -> SandboxPool:
        return self._pool

    @property
    def breaker(self) -> CircuitBreaker:
        """The default backend's circuit breaker."""
        return self._breakers[None]

    async def run_tasks(self, tasks: Sequence[Task], *, n: int = 1) -> list[RolloutRecord]:
        """Every task `n` times (a group per task), at most `concurrency` rollouts at once."""
        async with asyncio.TaskGroup() as group:
            runs = [group.create_task(self.run_group(task, n=n)) for task in tasks]
        return [record for run in runs for record in run.result()]

    async def run_group(self, task: Task, *, n: int, metadata: dict | None = None,
                        queued_at: float | None = None) -> list[RolloutRecord]:
        queued_at = time.time() if queued_at is None else queued_at
        async with asyncio.TaskGroup() as group:
            runs = [
                group.create_task(self.run_rollout(task, metadata={**(metadata or {}), "index": i}, queued_at=queued_at))
                for i in range(n)
            ]
        return [run.result() for run in runs]

    async def run_rollout(self, task: Task, *, metadata: dict | None = None,
                          queued_at: float | None = None) -> RolloutRecord:
        """One rollout, once one of the `concurrency` slots is free. `queued_at` (wall clock): when it was asked for
        (a fleet's dispatch; default now); the wait until it was admitted is its `admitted` event."""
        queued_at = time.time() if queued_at is None else queued_at
        async with self._slots:
            handle = self.server.open_rollout(
                sampling=self.config.sampling, metadata={"task_id": task.id, "agent": self._agent_name, **(metadata or {})},
                stop_rules=parse_stop_rules([*self.config.stop_rules, *task.stop_rules]),
            )
            self.server.rollout(handle.id).note("admitted", waited_s=round(max(0.0, time.time() - queued_at), 3))
            status, failure, reward = "ok", None, None
            try:
                if self.config.driver is not None:
                    reward, detail = await self.config.driver.attempt(self.server, task, handle)
                else:
                    reward, detail = await self._attempt(task, handle)
                self.server.rollout(handle.id).note("graded", reward=reward, detail=detail)
            except RolloutFailed as exc:
                status = "timeout" if exc.cause in ("timeout", "idle") else "failed"
                failure = Failure(cause=exc.cause, message=str(exc))
            except asyncio.CancelledError:
                status, failure = "failed", Failure(cause="cancelled", message="the run was cancelled")
                await asyncio.shield(self._finish(handle.id, status, failure, None))
                raise
            return await self._finish(handle.id, status, failure, reward)

    async def _finish(self, rollout_id: str, status: str, failure: Failure | None, reward: float | None) -> RolloutRecord:
        record = await self.server.finish_rollout(rollout_id, status=status, failure=failure, reward=reward)
        if self._on_finished is not None:
            result = self._on_finished(record)
            if asyncio.iscoroutine(result):
                await result
        return record

    async def _attempt(self, task: Task, handle) -> tuple[float, str]:
        rollout = self.server.rollout(handle.id)
        fresh = graded_fresh(task)
        captured = await self._run_agent(task, handle, rollout, fresh=fresh)
        if isinstance(captured, Grade):
            return captured.reward, captured.detail
        # The agent's box is gone: nothing it left running touches the grade.
        if captured.refused:
            rollout.note("tampering", **tampering_event(captured.refused))
        try:
            graded = await grade_fresh(task, lambda: self._pool.sandbox(*self._sandbox_for(task)), captured,
                                       answer=rollout.answer, answered=rollout.answered,
                                       setup_timeout_s=self.config.setup_timeout_s)  # fmt: skip
        except (GraderFailed, AgentError) as exc:
            raise RolloutFailed("grader", str(exc)) from exc
        return graded.reward, graded.detail

    async def _run_agent(self, task: Task, handle, rollout, *, fresh: bool) -> Grade | Captured:
        """The agent's run in its box; then its grade there (in place), or its changes captured (fresh)."""
        breaker = self._breakers.setdefault(task.image, CircuitBreaker(self.config.breaker))
        async with AsyncExitStack() as stack:
            if waited := await breaker.admit():
                rollout.note("sandbox_circuit_waited", seconds=round(waited, 3))
            try:
                box = await stack.enter_async_context(self._pool.sandbox(*self._sandbox_for(task)))
            except AgentError as exc:  # the backend cannot make a sandbox here (bwrap missing, namespaces refused)
                breaker.failed(str(exc))
                raise RolloutFailed("sandbox", f"the sandbox could not be made: {exc}") from exc
            breaker.succeeded()
            await self._prepare_workspace(task, box)
            base = await baseline(box) if fresh else None
            answer = answer_command(box.bin_dir, base_url=handle.base_url, tools_secret=handle.tools_secret,
                                    python=box.script_python, deadline_s=task.limits.wall_s)
            await box.put_files((answer,))
            try:
                launch = self.config.agent.prepare(
                    AgentRollout(
                        base_url=handle.base_url,
                        secret=handle.secret,
                        model=self.server.config.served_model_name,
                        workspace=box.workspace,
                        home=box.home,
                        instruction=task.instruction,
                    )
                )
            except AgentError as exc:
                raise RolloutFailed("agent", str(exc)) from exc
            self._agent_paths = tuple(dict.fromkeys((*self._agent_paths, *launch.host_paths)))
            result = await box.run(
                launch,
                limits=RunLimits(wall_s=task.limits.wall_s, idle_s=task.limits.idle_s),
                activity=rollout.activity,
                stop=rollout.stop_requested,  # a stop rule matched a sampled call: the agent is ended
            )
            if (hit := rollout.stopped) is not None:
                message = f"stopped by rule {hit.rule!r} before the agent ran {hit.tool} {hit.arguments[:200]}"
                if task.grading.stopped == "drop":
                    raise RolloutFailed("policy_stop", message)
                return Grade(0.0, message)
            for limit, count in result.limits_hit:  # each limit the run ran into is an event of the rollout
                rollout.note("limit_hit", limit=limit, count=count)
            for host, port, reason in result.egress_refused:  # each connection the box's proxy turned away
                rollout.note("egress_refused", host=host, port=port, reason=reason)
            _check_run(result, trailing_upstream_failures=rollout.trailing_upstream_failures,
                       replies_lost=rollout.replies_lost, answered=rollout.answered)
            try:
                if base is not None:
                    return await capture(task, box, base)
                return await grade_box(task, box, answer=rollout.answer, answered=rollout.answered)
            except (GraderFailed, AgentError) as exc:  # AgentError: the workspace could not be brought out
                raise RolloutFailed("grader", str(exc)) from exc

    @property
    def default_kind(self) -> Hashable:
        """The pool's key for the boxes of tasks with no image and the model-only network (what `async with` warms)."""
        return self._sandbox_for(None)[0]

    def _sandbox_for(self, task: Task | None) -> tuple[Hashable, Callable[[], Sandbox]]:
        """The kind of sandbox a task runs in (the pool's key) and how to make one (None: the default kind)."""
        if self._boxes is None:
            return ("custom",), self.config.sandbox
        return self._boxes(task.image, task.network, task.egress, task.workdir) if task is not None else self._boxes()

    async def _prepare_workspace(self, task: Task, box: Sandbox) -> None:
        try:
            await prepare_workspace(task, box, setup_timeout_s=self.config.setup_timeout_s)
        except SetupFailed as exc:
            raise RolloutFailed("sandbox", str(exc)) from exc


def placement_for(server: InterceptionServer, *, resources: ResourceLimits | None = None,
                  warm_paths: Callable[[], tuple[Path, ...]] = lambda: GRADER_PATHS) -> Placement:
    """Boxes that reach only this server, with its records (other rollouts' trajectories) hidden even where they lie
    inside an allowed path. `warm_paths()`, read as each box is made: what its warm spare binds besides the
    allow-list (the programs agents ran from so far, the graders' interpreter)."""
    url = urlsplit(server.url)
    record_path = server.config.record_path
    hidden = (Path(record_path).resolve().parent,) if record_path is not None else ()
    return Placement(endpoint=(url.hostname or "127.0.0.1", url.port or 80), hidden=hidden, resources=resources,
                     warm_paths=warm_paths)


def _check_run(result: RunResult, *, trailing_upstream_failures: int, replies_lost: int = 0,
               answered: bool = False) -> None:
    """Turn how the agent's run ended into a failure, or return if the rollout can be graded."""
    if result.outcome in ("timeout", "idle"):
        raise RolloutFailed(result.outcome, result.reason or f"the agent hit its {result.outcome} limit")
    if result.outcome == "limit":  # the run was ended for what it took (disk): kept out of training, with why
        raise RolloutFailed("limit", result.reason)
    if result.outcome == "spawn_failed":
        raise RolloutFailed("agent", f"the agent could not start: {result.reason}")
    if result.outcome == "cancelled":
        raise RolloutFailed("cancelled", result.reason or "cancelled")
    if trailing_upstream_failures:
        raise RolloutFailed("upstream", f"the agent's last {trailing_upstream_failures} chat call(s) failed upstream")
    tail = (result.stderr or result.stdout)[-_OUTPUT_KEPT:]
    if replies_lost and (result.exit_code != 0 or not answered):
        # the box gave up on this server's reply (its answer unrecorded, or the agent failed after): the host was
        # too slow, not the policy; a grade now would score the server's delay
        raise RolloutFailed("overload", f"the agent ended (status {result.exit_code}) after {replies_lost} of the "
                            f"server's replies to its box came too late: {tail}")
    if result.exit_code != 0:
        raise RolloutFailed("agent", f"the agent exited with status {result.exit_code}: {tail}")
