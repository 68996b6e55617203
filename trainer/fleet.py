"""A Ray fleet of interception nodes: more agents and sandboxes than one machine holds (`interceptor[ray]`).

    async with Fleet(FleetConfig(upstream=(vllm_url,), model=model_dir, out=out, runner=runner_config)) as fleet:
        records = await fleet.run_group(task, n=8)          # the group runs on the least-loaded node

One actor per Ray node (`_NodeHost`, pinned there with a node-affinity strategy) opens that node's policy stack
(`policy_stack.py`): an interception server in front of the policy replicas, its runner and its sandboxes; it
records to `out/nodes/<node>/rollouts.jsonl` on that node, and the driver writes every record it gets back to
`out/rollouts.jsonl`. A group goes to the live node with the fewest groups in flight (at most
`groups_per_node`). A node that dies (or whose actor stops answering) is dropped: the rollouts of its groups in
flight are recorded as infrastructure failures (cause `node_lost`, no reward, never trained on) and each such
group is dispatched again to a live node, so nothing finished is lost and nothing is scored twice. A group that
finishes after its node's raylet died is lost the same way (`NodeLeaving`): Ray ends a worker's child processes as
the worker exits, so its agents' failures then are the node's end, not theirs.

The fleet quacks as the runner and the gate the rollout worker and the weight transfer expect: `run_group`,
`server.policy.version`, `pause()` and `resume(policy_version=)` (every node's gate, so one version counter holds
across the fleet). Without Ray, everything runs in one process as before (`policy_stack.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from agents.runner import RunnerConfig
from agents.tasks import Task
from interceptor.store.records import Failure, RolloutRecord

from trainer.policy_stack import PolicyStack, StackConfig

__all__ = ["Fleet", "FleetConfig", "NodeLeaving", "NodeLost"]

log = logging.getLogger("trainer.fleet")


class NodeLost(RuntimeError):
    """Every node of the fleet is gone."""


class NodeLeaving(RuntimeError):
    """A node's raylet died while one of its groups ran. The worker lives on a moment (Ray ends its child processes
    as it exits, the agents' launchers among them), so what that group's rollouts report is the node's end, not
    theirs."""


@dataclass(frozen=True, kw_only=True)
class FleetConfig:
    upstream: tuple[str, ...]  # the policy servers' URLs, reachable from every node
    model: Path  # the tokenizer and chat template, at this path on every node
    out: Path
    runner: RunnerConfig
    groups_per_node: int = 4
    address: str | None = None  # a Ray cluster to join (None: the one ray.init finds, or a new local one)
    mode: str = "interception_gate"


class _NodeHost:
    """The part of the fleet on one node (a Ray actor; its methods run on the actor's event loop)."""

    def __init__(self) -> None:
        self._stack: PolicyStack | None = None
        self._raylet = os.getppid()  # the node's raylet started this worker: another parent means it is gone

    async def start(self, stack: StackConfig, runner: RunnerConfig) -> str:
        import ray

        self._stack = await PolicyStack(stack, runner=lambda server: runner).__aenter__()
        return ray.get_runtime_context().get_node_id()

    async def run_group(self, task: Task, n: int, metadata: dict, queued_at: float | None = None) -> list[bytes]:
        records = await self._stack.runner.run_group(task, n=n, metadata=metadata, queued_at=queued_at)
        self.check_raylet()
        return [record.to_json() for record in records]

    def check_raylet(self) -> None:
        """Raise `NodeLeaving` when this node's raylet is gone (this worker has been re-parented)."""
        if os.getppid() != self._raylet:
            raise NodeLeaving(f"the raylet of this node (pid {self._raylet}) is gone")

    async def pause(self) -> None:
        await self._stack.server.pause()

    async def stats(self) -> dict:
        """This node's process memory and live rollouts (for benchmarks and operators)."""
        import psutil

        return {"rss": psutil.Process().memory_info().rss, "live_rollouts": len(self._stack.server.registry)}

    async def resume(self, policy_version: int | None) -> None:
        await self._stack.server.resume(policy_version=policy_version)

    async def stop(self) -> None:
        if self._stack is not None:
            await self._stack.__aexit__(None, None, None)
            self._stack = None


@dataclass(eq=False)
class _Node:
    node_id: str
    host: object  # the actor handle
    in_flight: int = 0
    groups: int = 0
    alive: bool = True


@dataclass
class _Version:
    version: int = 0


@dataclass
class _FleetServer:
    """What the rollout worker reads of a server: the policy's version (the fleet's one counter)."""

    policy: _Version = field(default_factory=_Version)


class Fleet:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.nodes: list[_Node] = []
        self.server = _FleetServer()
        self.lost_rollouts = 0
        self._slot = asyncio.Condition()
        self._records = config.out / "rollouts.jsonl"

    # ------------------------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Fleet:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            ray.init(address=self.config.address, log_to_driver=False)
        self.config.out.mkdir(parents=True, exist_ok=True)
        host_class = ray.remote(num_cpus=0, max_restarts=0)(_NodeHost)
        alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
        hosts = [host_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
                 for node_id in alive]
        starts = []
        for node_id, host in zip(alive, hosts, strict=True):
            stack = StackConfig(upstream=self.config.upstream, model=self.config.model, mode=self.config.mode,
                                record_path=self.config.out / "nodes" / node_id[:12] / "rollouts.jsonl")
            starts.append(host.start.remote(stack, self.config.runner))
        started = await asyncio.gather(*starts, return_exceptions=True)
        for node_id, host, outcome in zip(alive, hosts, started, strict=True):
            if isinstance(outcome, BaseException):  # a node that died meanwhile (Ray still listed it as alive)
                log.warning("node %s did not start (%s): left out", node_id[:12], type(outcome).__name__)
                ray.kill(host, no_restart=True)
            else:
                self.nodes.append(_Node(node_id=outcome, host=host))
        if not self.nodes:
            raise NodeLost(f"no node of the fleet started: {started[0]!r}")
        log.info("fleet of %d node(s) started", len(self.nodes))
        return self

    async def __aexit__(self, *exc_info) -> None:
        import ray

        for node in self.nodes:
            if node.alive:
                try:
                    await asyncio.wait_for(node.host.stop.remote(), timeout=60)
                except Exception:  # a node lost at the end: its records are on its disk
                    log.warning("node %s did not stop cleanly", node.node_id[:12])
            ray.kill(node.host, no_restart=True)

    # ------------------------------------------------------------------------------------ groups

    async def run_group(self, task: Task, *, n: int, metadata: dict | None = None) -> list[RolloutRecord]:
        """The group's records, from the node it ran on; again elsewhere when its node is lost meanwhile."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        queued_at = time.time()  # each rollout's `admitted` event counts its wait from here, a node's queue included
        while True:
            node = await self._acquire()
            ref = node.host.run_group.remote(task, n, dict(metadata or {}), queued_at)
            try:
                payloads = await ref
            except asyncio.CancelledError:
                ray.cancel(ref)  # the worker stopped the group (stale): the node ends its agents
                raise
            except (ActorDiedError, ActorUnavailableError, RayActorError, NodeLeaving) as exc:
                self._lost(node, exc)
                self._write([self._lost_record(task, i, metadata, node) for i in range(n)])
                continue
            finally:
                await self._release(node)
            node.groups += 1
            records = [RolloutRecord.from_json_dict(orjson.loads(p)) for p in payloads]
            self._write(records)
            return records

    async def _acquire(self) -> _Node:
        async with self._slot:
            while True:
                live = [n for n in self.nodes if n.alive]
                if not live:
                    raise NodeLost("every node of the fleet is lost")
                free = [n for n in live if n.in_flight < self.config.groups_per_node]
                if free:
                    node = min(free, key=lambda n: n.in_flight)
                    node.in_flight += 1
                    return node
                await self._slot.wait()

    async def _release(self, node: _Node) -> None:
        async with self._slot:
            node.in_flight -= 1
            self._slot.notify_all()

    def _lost(self, node: _Node, exc: BaseException) -> None:
        if node.alive:
            log.warning("node %s lost (%s): its groups go to other nodes", node.node_id[:12], type(exc).__name__)
        node.alive = False

    def _lost_record(self, task: Task, index: int, metadata: dict | None, node: _Node) -> RolloutRecord:
        self.lost_rollouts += 1
        now = time.time()
        return RolloutRecord(
            rollout_id=f"lost-{uuid.uuid4().hex[:12]}", mode=self.config.mode, status="failed", samples=[],
            trace=[], usage={}, reward=None,
            failure=Failure(cause="node_lost", message=f"node {node.node_id[:12]} was lost while the rollout ran"),
            metadata={"task_id": task.id, **(metadata or {}), "index": index, "node": node.node_id[:12]},
            started_at=now, finished_at=now,
        )

    def _write(self, records: list[RolloutRecord]) -> None:
        with open(self._records, "ab") as out:
            for record in records:
                out.write(record.to_json() + b"\n")

    # ------------------------------------------------------------------------------------ the gate

    async def pause(self) -> None:
        await asyncio.gather(*(n.host.pause.remote() for n in self.nodes if n.alive), return_exceptions=True)

    async def resume(self, *, policy_version: int | None = None) -> None:
        await asyncio.gather(*(n.host.resume.remote(policy_version) for n in self.nodes if n.alive),
                             return_exceptions=True)
        if policy_version is not None:
            self.server.policy.version = policy_version

    def stats(self) -> list[dict]:
        return [{"node": n.node_id[:12], "alive": n.alive, "groups_in_flight": n.in_flight, "groups": n.groups}
                for n in self.nodes]

    async def node_stats(self) -> dict[str, dict]:
        """Each live node's process memory and live rollouts, asked of the node."""
        live = [n for n in self.nodes if n.alive]
        answers = await asyncio.gather(*(n.host.stats.remote() for n in live), return_exceptions=True)
        return {n.node_id[:12]: a for n, a in zip(live, answers, strict=True) if not isinstance(a, BaseException)}
