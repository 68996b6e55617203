"""The rollout worker's own rules, with a scripted runner in place of agents (the whole path with real agents and a
real trainer is `test_train_steps.py`): groups are pushed whole with group-relative advantages, dispatch stops while
the buffer is full, a group that would arrive too stale is stopped, a run without reward variance ends with
`NoLearningSignal` and one whose rollouts all fail with `RolloutsFailing`, TRL's version must be the gate's, and a
bug in a group stops the loop and is reported."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.tasks import Task
from interceptor.store.records import Failure, RolloutRecord, SampleRecord, TurnRecord
from trainer.rl.worker import InterceptorRolloutWorker, NoLearningSignal, RolloutsFailing, WorkerConfig

TASKS = [Task.from_dict({"id": f"t{i}", "instruction": "say 5", "grader": {"kind": "answer", "expected": "5"}},
                        base_dir=Path.cwd()) for i in range(3)]
WAIT_S = 60  # generous bound on waiting for the worker's loop; never asserted on


def failed_rollout(rid: str) -> RolloutRecord:
    return RolloutRecord(rollout_id=rid, mode="interception_gate", status="failed", samples=[], trace=[], usage={},
                         reward=None, failure=Failure(cause="agent", message="FileNotFoundError: No such file"))


def rollout(rid: str, reward: float, version: int) -> RolloutRecord:
    turn = TurnRecord(prompt_start=0, completion_start=2, completion_end=4, finish_reason="stop",
                      malformed_tool_call=False, model="policy", policy_version=version, seconds=0.01)
    sample = SampleRecord(index=0, input_ids=[10, 11, 12, 13], completion_mask=[0, 0, 1, 1],
                          old_logprobs=[0.0, 0.0, -0.5, -0.5], turns=[turn], auxiliary=False, fork_reason=None)
    return RolloutRecord(rollout_id=rid, mode="interception_gate", status="ok", samples=[sample], trace=[], usage={},
                         reward=reward)


class ScriptedRunner:
    """What the worker uses of `agents.runner.Runner`: `server.policy.version` and `run_group`. Each group's rewards
    come from `rewards(group_id)`; a group waits on `hold` when one is set."""

    def __init__(self, rewards: Callable[[int], list[float]]) -> None:
        self.server = SimpleNamespace(policy=SimpleNamespace(version=0))
        self.rewards = rewards
        self.calls: list[dict] = []  # per dispatched group: its metadata and the buffer's size then
        self.hold: asyncio.Event | None = None
        self.cancelled = 0
        self.worker: InterceptorRolloutWorker | None = None
        self.failing: Callable[[int], bool] = lambda group: False  # groups whose every rollout fails

    async def run_group(self, task: Task, *, n: int, metadata: dict) -> list[RolloutRecord]:
        self.calls.append({**metadata, "task": task.id, "buffered": self.worker.rollout_buffer.qsize()})
        try:
            if self.hold is not None:
                await self.hold.wait()
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        group = metadata["group_id"]
        if self.failing(group):
            return [failed_rollout(f"g{group}-{i}") for i in range(n)]
        return [rollout(f"g{group}-{i}", r, metadata["policy_version"]) for i, r in enumerate(self.rewards(group))]


def make_worker(runner: ScriptedRunner, **config) -> InterceptorRolloutWorker:
    config = {"num_generations": 4, "samples_per_step": 4, "max_staleness": 1} | config
    worker = InterceptorRolloutWorker(runner=runner, tasks=TASKS, loop=asyncio.get_running_loop(),
                                      config=WorkerConfig(**config))
    runner.worker = worker
    return worker


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.01)


def drain(worker: InterceptorRolloutWorker) -> list:
    out = []
    while not worker.rollout_buffer.empty():
        out.append(worker.rollout_buffer.get_nowait())
    return out


async def test_groups_are_pushed_whole_with_group_relative_advantages_and_their_version():
    runner = ScriptedRunner(lambda group: [1.0, 0.0, 0.0, 0.0])
    runner.server.policy.version = 3
    worker = make_worker(runner, max_inflight_groups=2)
    worker.start()
    samples: list = []
    try:
        while len(samples) < 16:  # as the trainer takes them: 4 groups
            await until(lambda: not worker.rollout_buffer.empty())
            samples += drain(worker)
    finally:
        await asyncio.to_thread(worker.stop)
    samples += drain(worker)
    by_group: dict[int, list] = {}
    for sample in samples:
        by_group.setdefault(sample.group_id, []).append(sample)
    assert all(len(group) == 4 for group in by_group.values())  # never a part of a group
    for group in by_group.values():
        assert sum(s.advantage for s in group) == pytest.approx(0.0, abs=1e-6)
        assert max(s.advantage for s in group) > 0 > min(s.advantage for s in group)
        assert {s.model_version for s in group} == {3}
    assert [c["task"] for c in runner.calls[:4]] == ["t0", "t1", "t2", "t0"]  # tasks in turn
    assert all(c["policy_version"] == 3 for c in runner.calls)


async def test_dispatch_stops_while_the_buffer_holds_what_the_inflight_groups_would_fill():
    runner = ScriptedRunner(lambda group: [1.0, 0.0, 1.0, 0.0])
    worker = make_worker(runner, max_inflight_groups=2)
    worker.start()
    try:
        await until(lambda: worker.rollout_buffer.qsize() >= 8)  # 2 groups of 4: full
        dispatched = len(runner.calls)
        for _ in range(50):  # the loop polls every 0.05 s; full, it must not start another group
            await asyncio.sleep(0.01)
        assert len(runner.calls) == dispatched and worker.rollout_buffer.qsize() == 8
        drain(worker)  # the trainer takes a step's samples: dispatch resumes
        await until(lambda: len(runner.calls) > dispatched)
    finally:
        await asyncio.to_thread(worker.stop)
    assert all(c["buffered"] < 8 for c in runner.calls)  # no group was started on a full buffer


async def test_a_group_that_would_arrive_staler_than_max_staleness_is_stopped_and_trains_nothing():
    runner = ScriptedRunner(lambda group: [1.0, 0.0, 0.0, 0.0])
    runner.hold = asyncio.Event()
    worker = make_worker(runner, max_staleness=1, max_inflight_groups=1)
    worker.start()
    try:
        await until(lambda: len(runner.calls) == 1)
        runner.server.policy.version = 2  # two syncs while the group ran: 2 - 0 > max_staleness
        await until(lambda: worker.counters["groups_stopped_stale"] == 1)
        assert runner.cancelled == 1 and worker.rollout_buffer.empty()
        runner.hold.set()  # the next group, dispatched at version 2, finishes and is pushed
        await until(lambda: worker.rollout_buffer.qsize() >= 4)
    finally:
        await asyncio.to_thread(worker.stop)
    assert [c["policy_version"] for c in runner.calls[:2]] == [0, 2]
    metrics = []
    while not worker.metrics_queue.empty():
        metrics.append(worker.metrics_queue.get_nowait())
    assert {"groups/stopped_stale_total": 1.0} in metrics


async def test_a_run_without_reward_variance_ends_with_no_learning_signal():
    runner = ScriptedRunner(lambda group: [1.0, 1.0, 1.0, 1.0])  # solved: every group is dropped
    worker = make_worker(runner, max_empty_groups=5)
    worker.start()
    try:
        await until(lambda: worker.counters["groups"] >= 5)
        with pytest.raises(NoLearningSignal, match="groups trained nothing"):
            worker.check_health(stale_after_s=3600)
    finally:
        await asyncio.to_thread(worker.stop)
    assert worker.rollout_buffer.empty() and worker.counters["samples"] == 0


async def test_groups_whose_every_rollout_failed_end_the_run_with_the_last_failure():
    runner = ScriptedRunner(lambda group: [0.0] * 4)
    runner.failing = lambda group: True
    worker = make_worker(runner, max_failed_groups=3)
    worker.start()
    try:
        await until(lambda: worker.counters["groups"] >= 3)
        with pytest.raises(RolloutsFailing, match=r"last \d+ groups failed; the last: agent: .*No such file"):
            worker.check_health(stale_after_s=3600)
    finally:
        await asyncio.to_thread(worker.stop)


async def test_one_rollout_that_ends_ok_resets_the_count_of_failed_groups():
    runner = ScriptedRunner(lambda group: [1.0, 0.0, 0.0, 0.0])
    runner.failing = lambda group: group % 2 == 0  # every other group fails whole
    worker = make_worker(runner, max_failed_groups=2, max_inflight_groups=1)
    worker.start()
    try:
        await until(lambda: drain(worker) is not None and worker.counters["groups"] >= 6)  # one group at a time
        worker.check_health(stale_after_s=3600)  # never 2 failed in a row
    finally:
        await asyncio.to_thread(worker.stop)


async def test_one_group_with_variance_resets_the_count_of_empty_groups():
    runner = ScriptedRunner(lambda group: [1.0, 0.0, 0.0, 0.0] if group % 3 == 2 else [0.0] * 4)
    worker = make_worker(runner, max_empty_groups=3, max_inflight_groups=4)  # the buffer holds 3 groups' samples
    worker.start()
    try:
        await until(lambda: worker.counters["groups"] >= 9)
        worker.check_health(stale_after_s=3600)  # never 3 empty in a row
    finally:
        await asyncio.to_thread(worker.stop)


async def test_trl_must_be_at_the_gates_policy_version():
    runner = ScriptedRunner(lambda group: [1.0, 0.0, 0.0, 0.0])
    runner.server.policy.version = 2
    worker = make_worker(runner)
    worker.update_model_version(2)
    with pytest.raises(RuntimeError, match="TRL is at policy version 3 but the interception gate stamps turns with 2"):
        worker.update_model_version(3)


async def test_a_bug_in_a_group_stops_the_loop_and_is_reported_by_check_health():
    def rewards(group: int) -> list[float]:
        raise KeyError("a bug")

    runner = ScriptedRunner(rewards)
    worker = make_worker(runner)
    worker.start()
    try:
        await until(lambda: worker._future.done())
        with pytest.raises(RuntimeError, match="the rollout loop stopped: KeyError"):
            worker.check_health(stale_after_s=3600)
    finally:
        await asyncio.to_thread(worker.stop)


async def test_stop_ends_the_groups_in_flight():
    runner = ScriptedRunner(lambda group: [1.0, 0.0, 0.0, 0.0])
    runner.hold = asyncio.Event()  # never set: the groups run until stopped
    worker = make_worker(runner, max_inflight_groups=2)
    worker.start()
    await until(lambda: len(runner.calls) == 2)
    await asyncio.to_thread(worker.stop)
    assert runner.cancelled == 2 and worker._future.done() and worker.rollout_buffer.empty()


def test_a_worker_needs_tasks_and_a_gate():
    runner = ScriptedRunner(lambda group: [])
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="at least one task"):
            InterceptorRolloutWorker(runner=runner, tasks=[], loop=loop)
        runner.server = SimpleNamespace(policy=None)
        with pytest.raises(ValueError, match="black_box"):
            InterceptorRolloutWorker(runner=runner, tasks=TASKS, loop=loop)
    finally:
        loop.close()
    with pytest.raises(ValueError, match="at least 2"):
        WorkerConfig(num_generations=1)
