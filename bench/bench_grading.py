"""What grading in a fresh box costs against grading in place, per task of the tiny SWE suite.

    .venv/bin/python bench/bench_grading.py [--repeats 5] [--pool 0,2] [--json OUT]

For each task of `examples/swe_tiny` (the gold fix applied by the "agent"), and each pool size in `--pool` (0: every
box made when needed; 2: boxes made ahead, as `Runner` keeps them under `async with`), the two ways are timed in
turn, the order alternating, from the agent's exit to the grade:
- in place: `grade_box` in the agent's own box, then the box closed;
- fresh: the changes captured, the agent's box closed, `grade_fresh` (a fresh box set up from the task again, the
  changes applied, the tests run with the report plugin).
Both include closing the agent's box. Between timed rounds the pool is given time to refill, as a runner's is
between rollouts. The sandbox backend is what `auto` picks here (namespaces where bubblewrap runs).
Prints p50/p90 per task and way, and fresh / in place from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.graders import grade_box  # noqa: E402
from agents.grading.fresh import baseline, capture, grade_fresh  # noqa: E402
from agents.sandbox.backends import BoxChooser, Placement  # noqa: E402
from agents.sandbox.pool import PoolConfig, SandboxPool  # noqa: E402
from agents.swe import load_swe_tasks  # noqa: E402
from agents.workspace import prepare_workspace  # noqa: E402
from examples.swe_tiny.make_suite import make_suite  # noqa: E402

SETUP_S = 120.0


async def _one(task, gold: str, pool: SandboxPool, kind, make, way: str) -> tuple[float, float]:
    """(seconds from the agent's exit to the grade, the reward)."""
    open_box = lambda: pool.sandbox(kind, make)  # noqa: E731
    box_cm = open_box()
    box = await box_cm.__aenter__()
    try:
        await prepare_workspace(task, box, setup_timeout_s=SETUP_S)
        base = await baseline(box) if way == "fresh" else None
        fixed = await box.exec(f"git apply - <<'EOF'\n{gold}EOF", timeout_s=SETUP_S)
        assert fixed.ok, fixed
        started = time.perf_counter()
        if way == "in_place":
            graded = await grade_box(task, box, answer=None, answered=False)
        else:
            captured = await capture(task, box, base)
    finally:
        await box_cm.__aexit__(None, None, None)
    if way == "fresh":
        graded = await grade_fresh(task, open_box, captured, answer=None, answered=False, setup_timeout_s=SETUP_S)
    return time.perf_counter() - started, graded.reward


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pool", default="0,2", help="pool sizes to run, comma-separated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    instances = make_suite(out)
    tasks = load_swe_tasks(instances, repos=out / "repos", cache=out / "cache")
    golds = {json.loads(line)["instance_id"]: json.loads(line)["patch"] for line in instances.read_text().splitlines()}
    chooser = BoxChooser("auto", Placement())
    kind, make = chooser()
    results: dict = {}
    for size in (int(s) for s in args.pool.split(",")):
        async with SandboxPool(PoolConfig(size=size)) as pool:
            for task in tasks:
                times: dict[str, list[float]] = {"in_place": [], "fresh": []}
                for repeat in range(args.repeats):
                    ways = ["in_place", "fresh"] if repeat % 2 == 0 else ["fresh", "in_place"]
                    for way in ways:
                        seconds, reward = await _one(task, golds[task.id], pool, kind, make, way)
                        assert reward == 1.0, (task.id, way, reward)
                        times[way].append(seconds)
                        await asyncio.sleep(0.5 + random.random() * 0.1)  # the pool refills, as between rollouts
                row = {way: {"p50_ms": statistics.median(v) * 1e3, "p90_ms": sorted(v)[int(0.9 * (len(v) - 1))] * 1e3}
                       for way, v in times.items()}  # fmt: skip
                row["fresh_over_in_place"] = row["fresh"]["p50_ms"] / row["in_place"]["p50_ms"]
                results[f"pool{size}/{task.id}"] = row
                in_place, fresh = row["in_place"]["p50_ms"], row["fresh"]["p50_ms"]
                print(f"pool {size}  {task.id:16s} in place p50 {in_place:7.1f} ms   fresh p50 {fresh:7.1f} ms   "
                      f"fresh / in place {row['fresh_over_in_place']:.2f}x", flush=True)
    results["backend"] = str(kind)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
