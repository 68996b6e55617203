"""A Ray fleet on a local multi-node cluster (`ray.cluster_utils.Cluster`: a head and two worker nodes on this
machine): groups of real command-agent rollouts run on the nodes' own interception servers and sandboxes, against
a local engine; a node lost mid-run has its rollouts recorded as infrastructure failures and its groups run again
elsewhere, and nothing finished is lost."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from agents.runner import RunnerConfig  # noqa: E402
from agents.specs.command import CommandAgent  # noqa: E402
from agents.tasks import load_tasks  # noqa: E402
from interceptor import SamplingSettings  # noqa: E402
from interceptor import read_records  # noqa: E402
from trainer.engine import EngineConfig, LocalEngine  # noqa: E402
from trainer.fleet import Fleet, FleetConfig  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()


def tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({
        "id": f"parity-{i}", "instruction": "Say anything.",
        "grader": {"kind": "python", "callable": "tests.trainer.parity_task:grade"},
        "limits": {"wall_s": 120, "idle_s": 60},
    }) + "\n" for i in range(4)))
    return path


def runner_config(delay_s: float) -> RunnerConfig:
    agent = CommandAgent(argv=(sys.executable, str(HERE / "parity_task.py"), str(delay_s)))
    return RunnerConfig(agent=agent, sampling=SamplingSettings(temperature=1.0, max_tokens=4), concurrency=4)


async def test_groups_run_on_the_nodes_own_servers_and_every_record_comes_back(cluster, tiny_model_dir, tmp_path):
    tasks = load_tasks(tasks_file(tmp_path))
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0)) as engine:
        config = FleetConfig(upstream=(engine.base_url,), model=tiny_model_dir, out=tmp_path / "run",
                             runner=runner_config(0.0), groups_per_node=1)
        async with Fleet(config) as fleet:
            groups = await asyncio.gather(*(fleet.run_group(task, n=2, metadata={"group_id": i})
                                            for i, task in enumerate(tasks)))
            used = [node for node in fleet.stats() if node["groups"]]
    records = [r for group in groups for r in group]
    assert len(records) == 8 and all(r.status == "ok" and r.reward is not None for r in records)
    assert all(len(r.samples) == 1 and r.samples[0].turns for r in records)  # token-exact samples from the nodes
    assert len(used) >= 2  # the groups spread over the nodes
    node_files = list((tmp_path / "run" / "nodes").glob("*/rollouts.jsonl"))
    assert len(node_files) >= 2 and sum(len(list(read_records(f))) for f in node_files) == 8  # kept on the nodes
    assert len(list(read_records(tmp_path / "run" / "rollouts.jsonl"))) == 8  # and gathered


async def test_a_node_lost_mid_run_fails_its_rollouts_as_infrastructure_and_its_groups_run_elsewhere(
    cluster, tiny_model_dir, tmp_path
):
    head_and_workers, workers = cluster
    tasks = load_tasks(tasks_file(tmp_path))[:2]
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0)) as engine:
        config = FleetConfig(upstream=(engine.base_url,), model=tiny_model_dir, out=tmp_path / "run",
                             runner=runner_config(3.0), groups_per_node=1)
        async with Fleet(config) as fleet:
            runs = [asyncio.ensure_future(fleet.run_group(task, n=2)) for task in tasks]
            while sum(node["groups_in_flight"] for node in fleet.stats()) < 2:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the agents are running on their nodes
            busy = {node["node"] for node in fleet.stats() if node["groups_in_flight"]}
            victim = next(w for w in workers if w.node_id[:12] in busy)
            head_and_workers.remove_node(victim, allow_graceful=False)
            groups = await asyncio.gather(*runs)
            stats = fleet.stats()
    assert all(len(group) == 2 and all(r.status == "ok" for r in group) for group in groups)  # ran again
    assert [n["alive"] for n in stats].count(False) == 1 and fleet.lost_rollouts == 2
    everything = list(read_records(tmp_path / "run" / "rollouts.jsonl"))
    lost = [r for r in everything if r.status == "failed"]
    assert len(lost) == 2 and all(r.failure.cause == "node_lost" and r.reward is None for r in lost)
    assert sum(r.status == "ok" for r in everything) == 4


def test_a_node_host_knows_its_raylet_is_gone_once_it_is_re_parented(tmp_path):
    """What a node's worker checks before it hands back a group: a real process tree, the stand-in for the raylet
    killed, the worker re-parented (as when Ray's raylet dies and the worker lives on a moment)."""
    import signal
    import subprocess

    child = (
        "import sys, time\n"
        "from trainer.fleet import NodeLeaving, _NodeHost\n"
        "host = _NodeHost()\n"
        "host.check_raylet()\n"
        "print('alive', flush=True)\n"
        "for _ in range(600):\n"
        "    try:\n"
        "        host.check_raylet()\n"
        "    except NodeLeaving as exc:\n"
        "        print('leaving:', exc, flush=True)\n"
        "        break\n"
        "    time.sleep(0.05)\n"
    )
    raylet = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
         "time.sleep(600)", child],
        stdout=subprocess.PIPE, text=True, cwd=HERE.parents[1],
    )
    try:
        assert raylet.stdout.readline().strip() == "alive"  # its parent is there: no error
        raylet.send_signal(signal.SIGKILL)
        raylet.wait()
        said = raylet.stdout.readline()  # the worker still writes to the pipe it inherited
    finally:
        raylet.kill()
    assert said.startswith("leaving: the raylet of this node (pid ") and said.rstrip().endswith("is gone")


async def test_grpo_steps_train_on_groups_from_the_fleet_and_go_on_when_a_node_is_lost(cluster, tiny_model_dir,
                                                                                       tmp_path):
    from trainer.train_main import TrainConfig, train

    head_and_workers, workers = cluster
    survivors = [w for w in workers if w in head_and_workers.worker_nodes]  # an earlier test may have removed one
    tasks = tasks_file(tmp_path)
    config = TrainConfig(tasks=tasks, model=tiny_model_dir, agent="command",
                         command=f"{sys.executable} {HERE / 'parity_task.py'} 0.5", out=tmp_path / "run",
                         max_tokens=4, num_generations=4, samples_per_step=4, max_steps=3, learning_rate=1e-3,
                         concurrency=4, fleet="ray")
    metrics = config.out / "metrics.jsonl"

    async def lose_a_node_after_the_first_step() -> None:
        while not (metrics.exists() and '"step"' in metrics.read_text()):
            await asyncio.sleep(0.2)
        head_and_workers.remove_node(survivors[0], allow_graceful=False)

    killer = asyncio.ensure_future(lose_a_node_after_the_first_step())
    result = await train(config)
    await killer
    assert len(result.reward_per_step) == 3 and result.engine_weight_version >= 4  # the run went on to the end
    records = list(read_records(config.out / "rollouts.jsonl"))
    failed = [(r.status, r.failure.cause, r.failure.message, r.reward) for r in records if r.status != "ok"]
    assert all(cause == "node_lost" and reward is None for status, cause, _, reward in failed if status == "failed"), \
        failed  # the records say why, should a node's own rollout ever fail here
    assert sum(r.status == "ok" for r in records) >= 12  # three steps' groups, finished and kept
    versions = [t.policy_version for r in records if r.status == "ok" for s in r.samples for t in s.turns]
    assert versions and max(versions) >= 2  # the nodes' gates followed the weight syncs
