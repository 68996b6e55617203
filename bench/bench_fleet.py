"""Rollouts across a Ray fleet: turns per second, errors, and memory per live rollout on each node.

    python bench/bench_fleet.py [--nodes 2] [--rollouts 1000] [--per-node 32] [--turns 4] [--group 8] [--json OUT]

Starts a local Ray cluster on this machine (a head and `--nodes` nodes, `ray.cluster_utils.Cluster`), an instant
fake upstream in this process (bench/bench_server.py: the policy costs nothing, so this measures the fleet), and a
`trainer.fleet.Fleet` whose nodes each run an interception server, a runner and `LocalSandbox`es. Every rollout is
a real command agent (bench/peers/curl_agent.sh: `--turns` chat calls through curl, then `answer`), in groups of
`--group`, all dispatched at once. Each node runs at most `--per-node` rollouts at once (its runner's concurrency;
0: every rollout it is given) and holds one group more than that waiting; the fleet keeps the rest until a node has
room. Reported: wall time, turns per second over the run, rollouts per second, rollouts that did not end ok (by
cause), each rollout's wait to be admitted (from the fleet's dispatch to its start on a node: p50, p99, max), and
per node the peak of live rollouts and of the node process's RSS above its idle RSS, divided: the memory one live
rollout costs a node (the agents' own processes are not counted).
Every node shares this machine's cores with the others, the upstream and the agents: read the figures as what one
machine does, not as a scaling curve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoTokenizer  # noqa: E402

from agents.runner import RunnerConfig  # noqa: E402
from agents.sandbox.base import LocalSandbox  # noqa: E402
from agents.specs.command import CommandAgent  # noqa: E402
from agents.tasks import load_tasks  # noqa: E402
from bench.bench_server import InstantUpstream, model_or_tiny  # noqa: E402
from interceptor import SamplingSettings  # noqa: E402

AGENT = Path(__file__).resolve().parent / "peers" / "curl_agent.sh"


async def measure(args: argparse.Namespace) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from trainer.fleet import Fleet, FleetConfig

    model = Path(model_or_tiny(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model)
    filler = tokenizer.encode(" the", add_special_tokens=False)[0]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    tasks_file = work / "tasks.jsonl"
    tasks_file.write_text(json.dumps({"id": "fleet", "instruction": "Do the work.",
                                      "grader": {"kind": "command", "command": "true"},
                                      "limits": {"wall_s": 1800, "idle_s": 600}}) + "\n")
    task = load_tasks(tasks_file)[0]
    nodes = args.nodes + 1
    per_node = args.per_node or -(-args.rollouts // nodes)
    runner = RunnerConfig(agent=CommandAgent(argv=("sh", str(AGENT), str(args.turns))),
                          sampling=SamplingSettings(max_tokens=16), concurrency=per_node, sandbox=LocalSandbox)
    try:
        async with InstantUpstream(filler, tokenizer.eos_token_id, max_model_len=32768) as upstream:
            config = FleetConfig(upstream=(upstream.url,), model=model, out=work / "run", runner=runner,
                                 groups_per_node=-(-per_node // args.group) + (1 if args.per_node else 0))
            async with Fleet(config) as fleet:
                idle = await fleet.node_stats()
                peaks: dict[str, dict] = {k: {"rss": v["rss"], "live_rollouts": 0} for k, v in idle.items()}
                groups = args.rollouts // args.group
                started = time.perf_counter()
                runs = asyncio.gather(*(fleet.run_group(task, n=args.group, metadata={"group_id": i})
                                        for i in range(groups)))
                while not runs.done():
                    await asyncio.wait([runs], timeout=0.5)
                    for node, now in (await fleet.node_stats()).items():
                        peak = peaks.setdefault(node, {"rss": now["rss"], "live_rollouts": 0})
                        peak["rss"] = max(peak["rss"], now["rss"])
                        peak["live_rollouts"] = max(peak["live_rollouts"], now["live_rollouts"])
                seconds = time.perf_counter() - started
                records = [r for group in runs.result() for r in group]
    finally:
        ray.shutdown()
        cluster.shutdown()
    turns = sum(len(t.turns) for r in records for t in r.samples)
    per_rollout = {node: round((peaks[node]["rss"] - idle[node]["rss"]) / max(1, peaks[node]["live_rollouts"]))
                   for node in idle}
    waits = sorted(e["waited_s"] for r in records for e in r.events if e["kind"] == "admitted")
    lost = args.rollouts // args.group * args.group - sum(r.status == "ok" for r in records)
    return {
        "nodes": nodes, "per_node": per_node, "rollouts": len(records), "lost": lost, "turns_per_rollout": args.turns, "seconds": round(seconds, 1),
        "turns_per_s": round(turns / seconds, 1), "rollouts_per_s": round(len(records) / seconds, 2),
        "not_ok": dict(Counter(r.failure.cause if r.failure else r.status for r in records if r.status != "ok")),
        "admission_wait_s": {"p50": _quantile(waits, 0.5), "p99": _quantile(waits, 0.99),
                             "max": waits[-1] if waits else None},
        "peak_live_rollouts_per_node": {node: peaks[node]["live_rollouts"] for node in idle},
        "node_bytes_per_live_rollout": per_rollout,
    }


def _quantile(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, int(q * len(values)))], 2) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2, help="Ray nodes beside the head (which runs a node too)")
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--per-node", type=int, default=32,
                        help="rollouts each node runs at once (0: all it is given, with no admission)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--model", help="model directory (default: the tiny model with the real Qwen vocabulary)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    for key, value in results.items():
        print(f"{key:>28}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
