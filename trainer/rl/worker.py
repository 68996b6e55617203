"""The rollout worker TRL's `AsyncGRPOTrainer` pulls samples from, fed by real agents through the interceptor.

It implements TRL's `RolloutWorkerProtocol` (`rollout_buffer`, `metrics_queue`, `start`, `stop`,
`update_model_version`, `check_health`). The trainer calls these from its own thread; the worker's loop runs on the
event loop that owns the interception server and the runner, and is reached with `run_coroutine_threadsafe`.

    loop:  take the next task -> stamp the policy version -> run `num_generations` rollouts as a group
           -> filter, group-relative advantages (trainer.rl.advantages) -> push the group's samples together

Demand-driven and bounded: at most `max_inflight_groups` groups run at once (by default enough for
`max_staleness` steps of `samples_per_step`), and a group stops dispatching while the buffer already holds that
many samples, so nothing queues without bound. A group that would arrive staler than `max_staleness` versions is
stopped (its agents ended, its rollouts recorded as cancelled) rather than finished and thrown away.

One policy-version counter: the interception gate's, which stamps every turn (`trainer.rl.weight_sync.GatedTransfer`
bumps it when a sync completes). The worker reads it, TRL's own count must equal it (checked when TRL reports it),
and each sample carries the lowest version among its turns (`trainer.rl.advantages.build_group`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import queue
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from agents.runner import Runner
from agents.tasks import Task

from trainer.rl.advantages import GroupFilter, build_group

__all__ = ["DEFAULT_MAX_STALENESS", "InterceptorRolloutWorker", "NoLearningSignal", "RolloutsFailing", "WorkerConfig"]


# Versions a sample may lag the trainer by, for the worker and `interceptor train` alike. TRL's AsyncGRPOConfig
# defaults to 4; two keeps samples nearer the policy being trained when a step takes minutes, as on a CPU.
DEFAULT_MAX_STALENESS = 2
_FAILURE_CHARS = 600  # of a failed rollout's message in RolloutsFailing: its end, where a traceback says what broke


class NoLearningSignal(RuntimeError):
    """`max_empty_groups` groups in a row trained nothing: the run has no signal left (the trainer saves and stops)."""


class RolloutsFailing(RuntimeError):
    """`max_failed_groups` groups in a row had no rollout that ended `ok`: the agent, its sandbox or the policy
    server is broken, not the policy. The run fails (its message has the last failure's cause and words), rather
    than wait for samples that will not come."""


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    num_generations: int = 4  # rollouts per task: one GRPO group
    samples_per_step: int = 4  # the trainer's per_device_train_batch_size
    max_staleness: int = DEFAULT_MAX_STALENESS  # as AsyncGRPOConfig.max_staleness
    max_inflight_groups: int | None = None  # default: ceil(max_staleness * samples_per_step / num_generations)
    filter: GroupFilter = field(default_factory=GroupFilter)
    stop_timeout_s: float = 60.0
    max_empty_groups: int = 64  # groups in a row that trained nothing (zero variance...): no learning signal left
    max_failed_groups: int = 4  # groups in a row whose every rollout failed: a fault, and the run fails

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ValueError("num_generations must be at least 2 for group-relative advantages")
        if self.samples_per_step < 1 or self.max_staleness < 0:
            raise ValueError("samples_per_step must be positive and max_staleness non-negative")
        if self.max_empty_groups < 1 or self.max_failed_groups < 1:
            raise ValueError("max_empty_groups and max_failed_groups must be at least 1")

    @property
    def inflight_groups(self) -> int:
        if self.max_inflight_groups is not None:
            return self.max_inflight_groups
        return max(1, math.ceil(max(1, self.max_staleness) * self.samples_per_step / self.num_generations))


class InterceptorRolloutWorker:
    def __init__(
        self,
        *,
        runner: Runner,
        tasks: Sequence[Task],
        loop: asyncio.AbstractEventLoop,
        config: WorkerConfig = WorkerConfig(),
    ) -> None:
        if not tasks:
            raise ValueError("the worker needs at least one task")
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.config = config
        self._runner = runner
        self._tasks = list(tasks)
        self._loop = loop
        if getattr(runner.server, "policy", None) is None:
            raise ValueError("the rollout worker trains on interception_gate rollouts; this server relays (black_box)")
        self._future: Future | None = None
        self._stopping: asyncio.Event | None = None
        self._last_progress = time.monotonic()
        self.counters: Counter = Counter()
        self._empty_groups_in_a_row = 0
        self._failed_groups_in_a_row = 0
        self._last_failure = ""  # the cause and words of the last failed rollout, for RolloutsFailing
        self.pushed: list[tuple[int, float, int]] = []  # (group_id, advantage, model_version) per sample pushed

    # ---------------------------------------------------------------------- TRL's protocol (trainer thread)

    @property
    def model_version(self) -> int:
        """The policy version: the interception gate's, the one counter that also stamps every turn."""
        return self._runner.server.policy.version

    def update_model_version(self, model_version: int) -> None:
        """TRL's count of syncs, told after each one: it must be the gate's (the transfer went through it)."""
        if model_version != self.model_version:
            raise RuntimeError(
                f"TRL is at policy version {model_version} but the interception gate stamps turns with "
                f"{self.model_version}: weight syncs must go through the gate (trainer.rl.weight_sync.GatedTransfer)"
            )

    def start(self) -> None:
        if self._future is not None:
            raise RuntimeError("the worker was already started")
        self._future = asyncio.run_coroutine_threadsafe(self._run(), self._loop)

    def stop(self) -> None:
        if self._future is None:
            return
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        try:
            self._future.result(timeout=self.config.stop_timeout_s)
        except Exception:  # the loop's own failure was reported by check_health; stopping must not raise it again
            pass

    def check_health(self, stale_after_s: float) -> None:
        if self._future is not None and self._future.done():
            error = self._future.exception()
            raise RuntimeError(f"the rollout loop stopped: {error!r}") from error
        if self._failed_groups_in_a_row >= self.config.max_failed_groups:
            raise RolloutsFailing(
                f"every rollout of the last {self._failed_groups_in_a_row} groups failed; the last: {self._last_failure}"
            )
        if self._empty_groups_in_a_row >= self.config.max_empty_groups:
            raise NoLearningSignal(
                f"the last {self._empty_groups_in_a_row} groups trained nothing (zero reward variance or failed "
                "rollouts): the tasks are solved, or unsolvable, for this policy; see the rollouts/* metrics"
            )
        idle = time.monotonic() - self._last_progress
        if idle > stale_after_s:
            raise RuntimeError(f"no group finished for {idle:.0f}s (stale after {stale_after_s}s)")

    # ------------------------------------------------------------------------------ the loop (event loop)

    async def _run(self) -> None:
        self._stopping = asyncio.Event()
        stopping = asyncio.ensure_future(self._stopping.wait())
        running: set[asyncio.Task] = set()
        failures: list[BaseException] = []
        tasks = itertools.cycle(self._tasks)
        group_ids = itertools.count()

        def finished(task: asyncio.Task) -> None:
            running.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())
                self._stopping.set()  # a bug in a group ends the loop; check_health reports it

        try:
            while not self._stopping.is_set():
                full = self.rollout_buffer.qsize() >= self.config.inflight_groups * self.config.num_generations
                if len(running) >= self.config.inflight_groups or full:
                    # wait for a group to finish, the trainer to drain the buffer, or stop
                    await asyncio.wait({*running, stopping}, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
                    continue
                task = asyncio.create_task(self._group(next(tasks), next(group_ids)))
                running.add(task)
                task.add_done_callback(finished)
        finally:
            stopping.cancel()
            for task in list(running):  # stopping: their agents are ended and the rollouts recorded as cancelled
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        if failures:
            raise failures[0]

    async def _group(self, task: Task, group_id: int) -> None:
        version = self.model_version
        run = asyncio.ensure_future(
            self._runner.run_group(
                task, n=self.config.num_generations, metadata={"group_id": group_id, "policy_version": version}
            )
        )
        watch = asyncio.ensure_future(self._watch_staleness(version, run))
        try:
            records = await run
        except asyncio.CancelledError:
            if self._stopping is not None and self._stopping.is_set():
                raise
            self.counters["groups_stopped_stale"] += 1
            self._push_metrics({"groups/stopped_stale_total": 1.0})
            return
        finally:
            watch.cancel()
        outcome = build_group(records, group_id=group_id, model_version=version, rules=self.config.filter)
        for sample in outcome.samples:
            self.rollout_buffer.put(sample)
            self.pushed.append((sample.group_id, sample.advantage, sample.model_version))
        self._last_progress = time.monotonic()
        self._empty_groups_in_a_row = 0 if outcome.samples else self._empty_groups_in_a_row + 1
        failed = [record for record in records if record.status != "ok"]
        if failed:
            last = failed[-1]
            cause, message = (last.failure.cause, last.failure.message) if last.failure else (last.status, "")
            self._last_failure = f"{cause}: {message[-_FAILURE_CHARS:]}" if message else cause
        self._failed_groups_in_a_row = self._failed_groups_in_a_row + 1 if len(failed) == len(records) else 0
        self.counters["groups"] += 1
        self.counters["samples"] += len(outcome.samples)
        self._push_metrics(_group_metrics(records, outcome, version, self.model_version))

    async def _watch_staleness(self, version: int, run: asyncio.Future) -> None:
        while not run.done():
            if self.model_version - version > self.config.max_staleness:
                run.cancel()
                return
            await asyncio.sleep(0.2)

    def _push_metrics(self, values: dict) -> None:
        self.metrics_queue.put(values)


def _group_metrics(records, outcome, dispatched: int, current: int) -> dict:
    turns = [sum(len(s.turns) for s in r.samples) for r in records]
    sampled = sum(sum(s.completion_mask) for r in records for s in r.samples)
    seconds = sum(t.seconds for r in records for s in r.samples for t in s.turns) or float("nan")
    metrics = {
        "rollouts/reward_mean": statistics.fmean(outcome.rewards) if outcome.rewards else float("nan"),
        "rollouts/reward_std": statistics.pstdev(outcome.rewards) if len(outcome.rewards) > 1 else float("nan"),
        "rollouts/zero_variance": (1.0 if outcome.dropped.get("zero_variance") else 0.0, 1.0),
        "rollouts/forks_per_rollout": statistics.fmean(r.forks for r in records),
        "rollouts/turns_mean": statistics.fmean(turns),
        "rollouts/sampled_tokens_per_s": sampled / seconds,
        "rollouts/staleness_at_finish": float(current - dispatched),
        "rollouts/samples_total": float(len(outcome.samples)),
        # the tree's size and what of it trains: each sampled token has mask 1 in one sample of its rollout
        "rollouts/samples_per_rollout": statistics.fmean(len(r.samples) for r in records),
        "rollouts/sampled_tokens_per_rollout": sampled / len(records),
    }
    if outcome.trained:  # over every rollout of the group, as the two above: failed ones train nothing
        trained = sum(int(s.completion_mask.sum()) for s in outcome.samples)
        metrics["rollouts/trained_samples_per_rollout"] = len(outcome.samples) / len(records)
        metrics["rollouts/trained_tokens_per_rollout"] = trained / len(records)
    for cause, count in outcome.failures.items():
        metrics[f"rollouts/failed_{cause}_total"] = float(count)
    for reason, count in outcome.dropped.items():
        metrics[f"rollouts/dropped_{reason}_total"] = float(count)
    return metrics
