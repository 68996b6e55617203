"""Steady load for a bounded time, and the server's memory under it.

    .venv/bin/python bench/soak.py [--seconds 60] [--concurrency 16] [--turns 4] [--max-rollouts 1000000] [--json OUT]

The server (interception_gate over the scripted fake upstream, admin API on, every finished rollout appended and
fsynced to a JSON Lines file in a temporary directory, as in training) runs in a child process
(`bench/child_server.py`). The parent, on 127.0.0.1 only, runs `--concurrency` workers; each opens a rollout over
the admin API, plays 2 to `--turns` chat turns, submits an answer through the tools route and finishes the rollout,
then starts the next. The load stops by itself at `--seconds` or `--max-rollouts`, whichever comes first.

The server's RSS is sampled every second. Reported: RSS before the load, after the warm-up, at the end and at its
peak; its growth per 1,000 rollouts (least-squares slope of RSS over rollouts finished, on the samples after the
warm-up); rollouts/s, turns/s, turn latency; failed requests; and what `/health` and the record file say after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from child_server import ChildServer  # noqa: E402

ADMIN_TOKEN = "admin-token-for-soak"
SAMPLE_EVERY_S = 1.0
MAX_FAILURES = 1_000  # a server that fails this often is broken, not slow: stop the load
REQUEST_TIMEOUT_S = 30.0


def rss_bytes(pid: int) -> int:
    try:
        import psutil
    except ImportError:  # /proc has the same figure on Linux
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for process {pid}") from None
    return psutil.Process(pid).memory_info().rss


@dataclass
class Load:
    deadline: float
    max_rollouts: int
    started: int = 0
    rollouts: int = 0  # finished
    turns: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def more(self) -> bool:
        in_time = time.monotonic() < self.deadline
        return in_time and self.started < self.max_rollouts and len(self.failures) < MAX_FAILURES


async def worker(index: int, http: aiohttp.ClientSession, url: str, load: Load, max_turns: int) -> None:
    rng = random.Random(index)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def post(path: str, body: dict, headers: dict, expected: int) -> dict | None:
        async with http.post(url + path, data=orjson.dumps(body), headers=headers) as resp:
            data = await resp.read()
        if resp.status != expected:
            load.failures.append(f"{path.split('/')[-1]} {resp.status} {data[:160]!r}")
            return None
        return orjson.loads(data)

    while load.more():
        load.started += 1
        opened = await post("/rollouts", {"metadata": {"worker": index}}, admin, 201)
        if opened is None:
            continue
        rid, auth = opened["id"], {"Authorization": f"Bearer {opened['secret']}"}
        messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": f"task {index}"}]
        for turn in range(rng.randint(2, max_turns)):
            started = time.perf_counter()
            body = {"model": "policy", "messages": messages, "max_tokens": 16}
            answer = await post(f"/rollout/{rid}/v1/chat/completions", body, auth, 200)
            load.latencies.append(time.perf_counter() - started)
            if answer is None:
                break
            load.turns += 1
            messages += [answer["choices"][0]["message"], {"role": "user", "content": f"next {turn}"}]
        tools = {"Authorization": f"Bearer {opened['tools_secret']}"}
        await post(f"/rollout/{rid}/v1/tools/answer", {"answer": "42"}, tools, 200)
        if await post(f"/rollouts/{rid}/finish", {"status": "ok", "reward": 1.0}, admin, 200) is not None:
            load.rollouts += 1


async def sample(pid: int, load: Load, samples: list[tuple[float, int, int]], stop: asyncio.Event) -> None:
    """(seconds since the load started, RSS, rollouts finished) every SAMPLE_EVERY_S, and once more at the end."""
    started = time.monotonic()
    while True:
        samples.append((time.monotonic() - started, rss_bytes(pid), load.rollouts))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
        if stop.is_set():
            samples.append((time.monotonic() - started, rss_bytes(pid), load.rollouts))
            return


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else float("nan")


async def soak(args: argparse.Namespace, url: str, pid: int) -> dict:
    rss_start = rss_bytes(pid)
    load = Load(deadline=time.monotonic() + args.seconds, max_rollouts=args.max_rollouts)
    samples: list[tuple[float, int, int]] = []
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        sampler = asyncio.create_task(sample(pid, load, samples, stop))
        started = time.monotonic()
        async with asyncio.timeout(args.seconds + 60):  # a worker finishes the rollout it is in, then stops
            async with asyncio.TaskGroup() as group:
                for index in range(args.concurrency):
                    group.create_task(worker(index, http, url, load, args.turns))
        seconds = time.monotonic() - started
        stop.set()
        await sampler
        async with http.get(url + "/health") as resp:
            health = await resp.json()
    after_warmup = [(rollouts, rss) for t, rss, rollouts in samples if t >= args.warmup_s]
    ordered = sorted(load.latencies)
    return {
        "seconds": seconds,
        "concurrency": args.concurrency,
        "rollouts": load.rollouts,
        "turns": load.turns,
        "rollouts_per_s": load.rollouts / seconds,
        "turns_per_s": load.turns / seconds,
        "turn_p50_ms": statistics.median(ordered) * 1e3 if ordered else float("nan"),
        "turn_p99_ms": ordered[int(0.99 * (len(ordered) - 1))] * 1e3 if ordered else float("nan"),
        "failures": len(load.failures),
        "first_failures": load.failures[:5],
        "rss_start_mib": rss_start / 2**20,
        "rss_after_warmup_mib": after_warmup[0][1] / 2**20 if after_warmup else float("nan"),
        "rss_end_mib": samples[-1][1] / 2**20,
        "rss_peak_mib": max(rss for _, rss, _ in samples) / 2**20,
        "fit_samples": len(after_warmup),
        "growth_mib_per_1000_rollouts": slope(after_warmup) * 1000 / 2**20 if len(after_warmup) > 2 else float("nan"),
        "live_rollouts_after": health.get("live_rollouts"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the load runs (default 60)")
    parser.add_argument("--concurrency", type=int, default=16, help="rollouts in flight (default 16)")
    parser.add_argument("--turns", type=int, default=4, help="at most this many turns per rollout, at least 2")
    parser.add_argument("--max-rollouts", type=int, default=1_000_000, help="stop after opening this many")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="samples before this are left out of the fit")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.turns < 2:
        parser.error("--turns must be at least 2")

    with tempfile.TemporaryDirectory(prefix="interceptor-soak-") as tmp:
        record_path = Path(tmp) / "rollouts.jsonl"
        with ChildServer(admin_token=ADMIN_TOKEN, record_path=record_path, log_path=Path(tmp) / "server.log") as server:
            figures = asyncio.run(soak(args, server.url, server.pid))
        with open(record_path, "rb") as f:
            figures["records_on_disk"] = sum(1 for _ in f)
        figures["record_file_mib"] = os.path.getsize(record_path) / 2**20

    print(f"soak: {figures['seconds']:.1f} s, {figures['concurrency']} rollouts in flight, 2-{args.turns} turns each, "
          f"server in its own process")
    rows = [
        ("rollouts finished", f"{figures['rollouts']:,}"),
        ("turns", f"{figures['turns']:,}"),
        ("rollouts/s", f"{figures['rollouts_per_s']:,.1f}"),
        ("turns/s", f"{figures['turns_per_s']:,.1f}"),
        ("turn latency p50 / p99", f"{figures['turn_p50_ms']:.2f} / {figures['turn_p99_ms']:.2f} ms"),
        ("failed requests", f"{figures['failures']:,}"),
        ("RSS before load", f"{figures['rss_start_mib']:.1f} MiB"),
        (f"RSS after {args.warmup_s:.0f} s warm-up", f"{figures['rss_after_warmup_mib']:.1f} MiB"),
        ("RSS at end", f"{figures['rss_end_mib']:.1f} MiB"),
        ("RSS peak", f"{figures['rss_peak_mib']:.1f} MiB"),
        ("RSS growth per 1,000 rollouts", f"{figures['growth_mib_per_1000_rollouts']:.3f} MiB "
                                          f"(fit over {figures['fit_samples']} samples after warm-up)"),
        ("live rollouts after (/health)", f"{figures['live_rollouts_after']}"),
        ("records on disk", f"{figures['records_on_disk']:,} ({figures['record_file_mib']:.1f} MiB)"),
    ]
    for name, value in rows:
        print(f"  {name:<32}{value}")
    for failure in figures["first_failures"]:
        print(f"  failure: {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if figures["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
