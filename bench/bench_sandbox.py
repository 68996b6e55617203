"""Sandbox start-up and capacity per backend: how long from `run()` to the agent's first request at its model
endpoint, and how many sandboxes this machine holds at once.

    python bench/bench_sandbox.py [--runs 20] [--concurrent 8 16 32] [--json OUT]
    python bench/bench_sandbox.py --layouts [--runs 20]     # the namespace box before and after its allow-list

The "agent" is `python3 -c` that sends one HTTP request to its `OPENAI_BASE_URL` (a tiny aiohttp endpoint on
127.0.0.1) and then, for the capacity figure, waits until told to exit. Reported per backend: the start-to-first-
request latency (p50, p90, max over `--runs` sequential cold starts: every sandbox is made anew, as a rollout's
is), and for each `--concurrent` N: whether N sandboxes all reached their endpoint at once, the wall time for the
N-th first request, and the memory they took (system `MemAvailable` before and while all are up). The namespace
backend is skipped where bubblewrap cannot make namespaces, the Docker one where no daemon answers.

Warm: the same start-to-first-request latency for a sandbox taken from a ready warm pool (`agents.sandbox.pool`: made,
entered and `warm()`ed ahead, untimed), which is what a rollout of `async with Runner(...)` gets; and the memory
that `--prepared` idle prepared sandboxes hold while they wait.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp import web  # noqa: E402

from agents.sandbox.base import LocalSandbox, RunLimits  # noqa: E402
from agents.sandbox.cgroups import ResourceLimits  # noqa: E402
from agents.sandbox.docker import DockerSandbox, docker_unavailable  # noqa: E402
from agents.sandbox.namespace import NamespaceSandbox, namespaces_unavailable  # noqa: E402
from agents.sandbox.pool import prepare  # noqa: E402
from agents.specs.spec import AgentLaunch  # noqa: E402

AGENT = (
    "import os, sys, urllib.request\n"
    "urllib.request.urlopen(os.environ['OPENAI_BASE_URL'] + '/models?who=' + sys.argv[1]).read()\n"
    "urllib.request.urlopen(os.environ['OPENAI_BASE_URL'] + '/wait?who=' + sys.argv[1]).read()\n"
)


class Endpoint:
    """Records when each sandbox's first request arrives; `/wait` holds the agent until `release`."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.release = asyncio.Event()
        self.port = 0

    async def models(self, request: web.Request) -> web.Response:
        self.arrived[request.query["who"]] = time.perf_counter()
        return web.json_response({"data": []})

    async def wait(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return web.json_response({})


def _available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _one(make, endpoint: Endpoint, who: str, *, warm: bool = False) -> tuple[float, str]:
    async with contextlib.AsyncExitStack() as stack:
        if warm:  # as a pool hands it out: made, entered and warmed before the clock starts
            box = await prepare(make)
            stack.push_async_exit(box.__aexit__)
            if not box.warm_ready:
                raise RuntimeError("the sandbox did not warm")
        else:
            box = await stack.enter_async_context(make())
        python = "python3" if isinstance(box, DockerSandbox) else sys.executable  # the image's own python
        launch = AgentLaunch(argv=(python, "-c", AGENT, who), cwd=box.workspace,
                             env={"OPENAI_BASE_URL": f"http://127.0.0.1:{endpoint.port}/rollout/bench/v1"})
        started = time.perf_counter()
        result = await box.run(launch, limits=RunLimits(wall_s=120, idle_s=None))
        if warm and box.warm_starts != 1:
            raise RuntimeError("the warm sandbox's run started cold")
    return started, result.outcome + (f" {result.exit_code}" if result.exit_code else "")


def _percentiles(latencies: list[float], prefix: str) -> dict:
    latencies = sorted(latencies)
    return {f"{prefix}_ms_p50": round(statistics.median(latencies), 1),
            f"{prefix}_ms_p90": round(latencies[int(0.9 * (len(latencies) - 1))], 1),
            f"{prefix}_ms_max": round(latencies[-1], 1)}


async def _prepared_memory(make, count: int) -> float:
    """MiB of available memory each idle prepared sandbox takes (`count` of them, waiting)."""
    before = _available_mib()
    boxes = [await prepare(make) for _ in range(count)]
    await asyncio.sleep(1.0)  # their processes finish starting
    during = _available_mib()
    for box in boxes:
        await box.__aexit__(None, None, None)
    return round((before - during) / count, 1)


async def measure(name: str, make, endpoint: Endpoint, runs: int, concurrent: list[int], prepared: int) -> dict:
    endpoint.release.set()
    report: dict = {}
    for mode in ("cold", "warm"):
        latencies = []
        for i in range(runs):  # alternating would interleave the two; each mode is a sequence of `runs` starts
            who = f"{name}-{mode}-{i}"
            started, outcome = await _one(make, endpoint, who, warm=mode == "warm")
            if who not in endpoint.arrived:
                raise RuntimeError(f"{name}: the agent never reached its endpoint ({outcome})")
            latencies.append((endpoint.arrived[who] - started) * 1000)
        report |= _percentiles(latencies, mode)
    report["prepared_mib_each"] = await _prepared_memory(make, prepared)
    report["concurrent"] = {}
    for n in concurrent:
        endpoint.release.clear()
        before = _available_mib()
        started = time.perf_counter()
        tasks = [asyncio.create_task(_one(make, endpoint, f"{name}-{n}-{i}")) for i in range(n)]
        names = [f"{name}-{n}-{i}" for i in range(n)]
        deadline = time.monotonic() + 120
        while not all(w in endpoint.arrived for w in names) and time.monotonic() < deadline:
            if any(t.done() for t in tasks):
                break
            await asyncio.sleep(0.05)
        up = sum(w in endpoint.arrived for w in names)
        during = _available_mib()
        last = max((endpoint.arrived[w] for w in names if w in endpoint.arrived), default=started)
        endpoint.release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        report["concurrent"][n] = {"all_up": up == n, "up": up, "last_first_request_s": round(last - started, 2),
                                   "memory_mib_per_sandbox": round((before - during) / max(up, 1), 1)}
    return report


class _HostRootSandbox(NamespaceSandbox):
    """The namespace box as it was before its allow-list: the host's / bound read-only under the same tmpfs and
    bridge. Here only to be timed against the allow-list in one run; never a backend."""

    def _binds(self, launch: AgentLaunch) -> list[Path]:
        return [Path("/")]

    def _links(self) -> tuple[tuple[str, str], ...]:
        return ()


async def compare_layouts(endpoint: Endpoint, runs: int) -> dict:
    """Cold and warm start-to-first-request of three namespace layouts, interleaved start by start (round after
    round in shuffled order), each figure also as a ratio to the first: the host's / without limits (before), the
    allow-list without limits, and the default (the allow-list with DEFAULT_LIMITS' cgroup, where it can be made)."""
    at = ("127.0.0.1", endpoint.port)
    layouts = {
        "host_root": lambda: _HostRootSandbox(endpoint=at, resources=ResourceLimits()),
        "allow_list": lambda: NamespaceSandbox(endpoint=at, resources=ResourceLimits()),
        "default": lambda: NamespaceSandbox(endpoint=at),
    }
    endpoint.release.set()
    latencies: dict[tuple[str, str], list[float]] = {(n, m): [] for n in layouts for m in ("cold", "warm")}
    for i in range(runs + 1):  # the first round warms the page cache and is not kept
        order = [(name, mode) for name in layouts for mode in ("cold", "warm")]
        random.shuffle(order)
        for name, mode in order:
            who = f"layout-{name}-{mode}-{i}"
            started, outcome = await _one(layouts[name], endpoint, who, warm=mode == "warm")
            if who not in endpoint.arrived:
                raise RuntimeError(f"{name}: the agent never reached its endpoint ({outcome})")
            if i:
                latencies[name, mode].append((endpoint.arrived[who] - started) * 1000)
    report: dict = {}
    for name in layouts:
        report[name] = {}
        for mode in ("cold", "warm"):
            report[name] |= _percentiles(latencies[name, mode], mode)
            base = statistics.median(latencies["host_root", mode])
            report[name][f"{mode}_p50_ratio"] = round(statistics.median(latencies[name, mode]) / base, 2)
    return report


async def main_async(args: argparse.Namespace) -> dict:
    endpoint = Endpoint()
    app = web.Application()
    app.router.add_get("/rollout/bench/v1/models", endpoint.models)  # a box reaches only rollout routes
    app.router.add_get("/rollout/bench/v1/wait", endpoint.wait)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint.port = runner.addresses[0][1]
    backends = {"local": LocalSandbox}
    if (reason := namespaces_unavailable()) is None:
        backends["namespace"] = lambda: NamespaceSandbox(endpoint=("127.0.0.1", endpoint.port))
    else:
        print(f"namespace: skipped ({reason})")
    if (reason := docker_unavailable()) is None:
        backends["docker"] = lambda: DockerSandbox(image=args.image, endpoint=("127.0.0.1", endpoint.port))
    else:
        print(f"docker: skipped ({reason})")
    try:
        if args.layouts:
            if "namespace" not in backends:
                raise SystemExit("--layouts needs the namespace sandbox")
            return {"layouts": await compare_layouts(endpoint, args.runs)}
        return {name: await measure(name, make, endpoint, args.runs, args.concurrent, args.prepared)
                for name, make in backends.items()}
    finally:
        await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--concurrent", type=int, nargs="*", default=[8, 16, 32])
    parser.add_argument("--prepared", type=int, default=8, help="idle prepared sandboxes for the memory figure")
    parser.add_argument("--image", default="interceptor/debian-python:bookworm",
                        help="the Docker backend's image (scripts/setup-docker.sh builds this one offline)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--layouts", action="store_true",
                        help="only the namespace box's start, before (the host's /) and after its allow-list and limits")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if args.layouts:
        print(f"{'layout':<11} {'cold p50 ms':>11} {'p90':>7} {'ratio':>6} {'warm p50 ms':>11} {'p90':>7} {'ratio':>6}")
        for name, r in results["layouts"].items():
            print(f"{name:<11} {r['cold_ms_p50']:>11} {r['cold_ms_p90']:>7} {r['cold_p50_ratio']:>6} "
                  f"{r['warm_ms_p50']:>11} {r['warm_ms_p90']:>7} {r['warm_p50_ratio']:>6}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        return 0
    print(f"{'backend':<10} {'cold p50 ms':>11} {'p90':>7} {'max':>7} {'warm p50 ms':>11} {'p90':>7} {'max':>7} "
          f"{'prepared MiB':>12}   concurrent: up/N, last first request, MiB each")
    for name, r in results.items():
        cells = "  ".join(f"{n}: {c['up']}/{n} {c['last_first_request_s']}s {c['memory_mib_per_sandbox']}"
                          for n, c in r["concurrent"].items())
        print(f"{name:<10} {r['cold_ms_p50']:>11} {r['cold_ms_p90']:>7} {r['cold_ms_max']:>7} {r['warm_ms_p50']:>11} "
              f"{r['warm_ms_p90']:>7} {r['warm_ms_max']:>7} {r['prepared_mib_each']:>12}   {cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
