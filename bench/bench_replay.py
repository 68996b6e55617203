"""Agent-shaped traffic at scale: recorded sessions of real agents replayed, hundreds at once, against each target.

    python -m bench.replay.record                     # once: the corpus (real agents, ~30 min; not committed)
    python bench/bench_replay.py [--sessions 96,192,384] [--timing realistic,instant] [--slice-s 20] [--slices 3]
                                 [--settle-s 5]
                                 [--targets direct,black_box,gate] [--gate-workers 2] [--pin 0:1] [--json OUT]
                                 [--gate-off fast_lane,lean_client,tiktoken_twin,suffix_writer]

Processes, each its own: the replay model (bench/replay/upstream.py: every answer is the recorded one), the gate
(`interception_gate`, recording as in training), `black_box`, with `--gate-workers N` the gate as N workers behind
one front (`gate_wN`), and with `--gate-off A,B` the gate with accelerator A off (`gate-A`), and B. This process is
only the load generator. Targets:
- `direct`: the agent's requests straight to the model server (the replay model's own chat, Messages and
  Responses endpoints): the one baseline every target's figures are taken against;
- `black_box`, `gate`, `gate_wN`: the same requests through Interceptor, each copy of a session its own rollout.

A target holds a population of N session copies. Copy c of a session sends its recorded requests in order, each
when the one it followed in the recording has been answered and the agent's recorded time after it (its tools, its
own work) has passed; requests that overlapped in the recording overlap here (a title beside the first turn). The
tool-call ids a target gave are echoed back in place of the recorded ones, as the agent would. Copies of a session
are the same conversation, as the rollouts of a GRPO group are at their start (what the gate keeps across
rollouts, a first turn's chunk ids and the tool lists, a group shares too). A copy that finishes closes its rollout
and a new copy begins.
Before measuring, each new copy is brought to a random depth of its session against an instant model (so the
contexts measured are spread as in a steady run, not all at the start).

Upstream timing (`--timing`): `realistic`: every answer takes prefill of the tokens new since the session's
previous turn at `--prefill-tps` plus decode of the reply at `--decode-tps` (one request's share of a busy policy
server), and the agent's recorded think time is kept; `instant`: answers at once and no think time (what a process
can do at most). Each N is measured in `--slices` slices of `--slice-s` per target, the targets taking turns (the
others' copies wait and think no further), so machine noise hits them alike; a slice is measured after `--settle-s`
(the copies whose answers came while it waited all go on at once: a burst no steady run has). Turns that start in
a measured window give the latencies; those that end in one, the turns/s. Reported per target: turns/s and
input tokens/s; capture cost (1 - its turns/s over `direct`'s in the same run, and from its mean added time per turn
by Little's law: added / (N / direct's turns/s + added), steadier over short slices); added latency p50/p99 per
turn (its time for a request minus `direct`'s median for the same request) at contexts around 8k, 32k, 100k and
200k tokens; CPU seconds of
its processes per turn; RSS per live session (its processes' RSS with N sessions live, less before any, over N);
errors (an answer whose status is not the recorded one). `--pin A:B` runs this process and the model on cores A
and the targets on cores B (`taskset`), so the targets' share of the machine is known.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_server import model_or_tiny  # noqa: E402
from bench.peers.launch import DirectTarget, InterceptorTarget, Target, start_process  # noqa: E402
from bench.replay.corpus import CALL_IDS, Session, describe, load_corpus  # noqa: E402
from interceptor.config import ServerConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "replay" / "corpus"
DEFAULT_MAX_TOKENS = ServerConfig.__dataclass_fields__["default_max_tokens"].default  # the recording server's
BUCKETS = ((8_000, 4_000, 16_000), (32_000, 16_000, 64_000), (100_000, 64_000, 150_000), (200_000, 150_000, 10**9))


@dataclass
class Turn:
    session: str
    index: int
    prompt_tokens: int
    seconds: float
    ok: bool
    at: float  # when it ended (perf_counter)

    @property
    def started(self) -> float:
        return self.at - self.seconds


@dataclass
class Population:
    """One target's session copies."""

    target: Target
    sessions: list[Session]
    http: aiohttp.ClientSession
    rng: random.Random
    think: bool = False
    active: asyncio.Event = field(default_factory=asyncio.Event)  # set while its target's slice runs
    paused: asyncio.Event = field(default_factory=asyncio.Event)  # set while it does not
    measuring: bool = False
    turns: list[Turn] = field(default_factory=list)
    copies: itertools.count = field(default_factory=itertools.count)
    tasks: list[asyncio.Task] = field(default_factory=list)
    finished: int = 0  # copies that ran to their session's end

    async def grow(self, n: int) -> None:
        """Add copies until there are `n`, each brought to a random depth of its session (instantly, unmeasured)."""
        ready = []
        while len(self.tasks) < n:
            warmed = asyncio.get_running_loop().create_future()
            self.tasks.append(asyncio.create_task(self._slot(len(self.tasks), warmed)))
            ready.append(warmed)
        await asyncio.gather(*ready)

    async def _slot(self, slot: int, warmed: asyncio.Future) -> None:
        first = True
        while True:
            copy = next(self.copies)
            session = self.sessions[(slot + copy) % len(self.sessions)]
            depth = self.rng.randrange(len(session.requests)) if first else 0
            await self._copy(session, copy, depth, warmed if first else None)
            first = False

    async def _copy(self, session: Session, copy: int, depth: int, warmed: asyncio.Future | None) -> None:
        endpoint = await self.target.open(self.http)
        base = endpoint.chat_url.removesuffix("/chat/completions")
        auth = {"Authorization": endpoint.headers.get("Authorization", ""),
                "x-api-key": endpoint.headers.get("Authorization", "").removeprefix("Bearer ")}
        swaps: dict[bytes, bytes] = {}  # recorded tool-call id -> the one this target gave
        answered = [asyncio.Event() for _ in session.requests]
        try:
            warm = [r for r in session.requests if r.index < depth]
            for request in warm:  # sent one after the other, instantly: the copy's history as the target holds it
                await self._send(request, base, auth, swaps, session, measured=False)
                answered[request.index].set()
            if warmed is not None and not warmed.done():
                warmed.set_result(None)
            async with asyncio.TaskGroup() as group:
                for request in session.requests[depth:]:
                    group.create_task(self._follow(request, base, auth, swaps, session, answered))
            self.finished += 1
        finally:
            with contextlib.suppress(Exception):
                await self.target.close(self.http, endpoint)

    async def _follow(self, request, base, auth, swaps, session, answered) -> None:
        if request.after is not None:
            await answered[request.after].wait()
            if self.think and request.think_s:
                await self.think_for(request.think_s)
        await self.active.wait()
        await self._send(request, base, auth, swaps, session, measured=True)
        answered[request.index].set()

    def run(self, on: bool) -> None:
        (self.active.set if on else self.active.clear)()
        (self.paused.clear if on else self.paused.set)()

    async def think_for(self, seconds: float) -> None:
        """The agent's time between turns, counted only while the population runs: a paused population's agents
        think no further, so its copies do not all fall due at once when its next slice starts."""
        left = seconds
        while left > 0:
            await self.active.wait()
            started = time.perf_counter()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.paused.wait()
            left -= time.perf_counter() - started

    async def _send(self, request, base, auth, swaps, session, *, measured: bool) -> None:
        body = request.render(swaps)
        started = time.perf_counter()
        async with self.http.request(request.method, base + request.path, data=body if body else None,
                                     headers={**request.headers, **auth}) as response:
            data = await response.read()
            status = response.status
        ended = time.perf_counter()
        if request.call_ids:
            swaps.update(zip(request.call_ids, CALL_IDS.findall(data)))
        if measured and self.measuring:
            self.turns.append(Turn(session.name, request.index, request.prompt_tokens, ended - started,
                                   status == request.status, ended))


# ------------------------------------------------------------------------------------------------ processes


def _tree(pid: int) -> list[psutil.Process]:
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def cpu_seconds(pid: int) -> float:
    total = 0.0
    for p in _tree(pid):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def rss(pid: int) -> int:
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def start_all(stack: contextlib.ExitStack, args, model: Path, logs: Path) -> tuple[str, dict[str, tuple[Target, int | None]]]:
    pin = ["taskset", "-c", args.pin.split(":")[1]] if args.pin else []
    model_ready = stack.enter_context(start_process(
        "model", [sys.executable, str(ROOT / "bench" / "replay" / "upstream.py"), "--corpus", str(args.corpus), "--model", str(model)],
        logs))
    url = model_ready.ready["url"]
    server = [*pin, sys.executable, str(ROOT / "bench" / "peers" / "interceptor_server.py"), "--upstream", url,
              "--default-max-tokens", str(DEFAULT_MAX_TOKENS)]  # as recorded: a cut reply would be a rewritten history
    targets: dict[str, tuple[Target, int | None]] = {"direct": (DirectTarget("direct", url), None)}
    wanted = args.targets.split(",")
    if "black_box" in wanted:
        p = stack.enter_context(start_process("black_box", [*server, "--mode", "black_box"], logs))
        targets["black_box"] = (InterceptorTarget("black_box", p.ready["url"], p.ready["admin_token"]), p.pid)
    gate = [*server, "--mode", "interception_gate", "--model", str(model)]
    if "gate" in wanted:
        p = stack.enter_context(start_process("gate", [*gate, "--record", str(logs / "gate.jsonl")], logs))
        targets["gate"] = (InterceptorTarget("gate", p.ready["url"], p.ready["admin_token"]), p.pid)
    for n in (int(w) for w in args.gate_workers.split(",") if w and int(w) > 1):
        name = f"gate_w{n}"
        p = stack.enter_context(start_process(
            name, [*gate, "--record", str(logs / f"{name}.jsonl"), "--workers", str(n)], logs))
        targets[name] = (InterceptorTarget(name, p.ready["url"], p.ready["admin_token"]), p.pid)
    for name in (n for n in args.gate_off.split(",") if n):
        label = f"gate-{name}"
        p = stack.enter_context(start_process(
            label, [*gate, "--record", str(logs / f"{label}.jsonl"), "--off", name], logs))
        targets[label] = (InterceptorTarget(label, p.ready["url"], p.ready["admin_token"]), p.pid)
    return url, targets


# ------------------------------------------------------------------------------------------------ the run


async def set_timing(http: aiohttp.ClientSession, url: str, prefill: float, decode: float) -> dict:
    async with http.post(url + "/admin/timing", json={"prefill_tps": prefill, "decode_tps": decode}) as response:
        return await response.json()


def figures(name: str, turns: list[Turn], done: int, seconds: float, cpu: float, direct_median: dict) -> dict:
    """`turns`: those started in the measured windows (latency); `done`: how many ended in them (throughput)."""
    ok = [t for t in turns if t.ok]
    row = {"turns_per_s": round(done / seconds, 1),
           "input_tokens_per_s": round(sum(t.prompt_tokens for t in ok) / max(1, len(ok)) * done / seconds),
           "errors": len(turns) - len(ok),
           "cpu_ms_per_turn": round(cpu / max(1, len(ok)) * 1e3, 2) if name != "direct" else None}
    every = [t.seconds - direct_median[(t.session, t.index)] for t in ok if (t.session, t.index) in direct_median]
    row["added_mean_ms"] = round(statistics.fmean(every) * 1e3, 2) if every and name != "direct" else None
    for label, low, high in BUCKETS:
        added = [t.seconds - direct_median[(t.session, t.index)] for t in ok
                 if low <= t.prompt_tokens < high and (t.session, t.index) in direct_median]
        own = [t.seconds for t in ok if low <= t.prompt_tokens < high]
        key = f"{label // 1000}k"
        if name == "direct":
            row[f"p50_ms_{key}"] = round(statistics.median(own) * 1e3, 2) if own else None
        else:
            row[f"added_p50_ms_{key}"] = round(_pct(added, 0.5) * 1e3, 2) if added else None
            row[f"added_p99_ms_{key}"] = round(_pct(added, 0.99) * 1e3, 2) if added else None
            row[f"n_{key}"] = len(added)
    return row


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args, sessions: list[Session], url: str, targets: dict) -> dict:
    results: dict = {"corpus": describe(sessions)}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        idle_rss = {name: rss(pid) for name, (_, pid) in targets.items() if pid}
        for timing in args.timing.split(","):
            realistic = timing == "realistic"
            populations = {name: Population(target, sessions, http, random.Random(7), think=realistic)
                           for name, (target, _) in targets.items()}
            for n in (int(x) for x in args.sessions.split(",")):
                await set_timing(http, url, 0, 0)
                for name, population in populations.items():  # warm each target alone, paused
                    population.measuring = False
                    # Warm requests are sent paused; a copy at its depth waits there. (Run while the others
                    # warmed, early copies went on at the instant model's pace to their sessions' ends: a first
                    # slice then held ~3x the finished rollouts of a steady run, each a ~40 ms sample build.)
                    population.run(False)
                    await population.grow(n)
                if realistic:
                    await set_timing(http, url, args.prefill_tps, args.decode_tps)
                active_s: dict[str, float] = defaultdict(float)
                windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
                cpu: dict[str, float] = defaultdict(float)
                for population in populations.values():
                    population.turns = []
                    population.measuring = True
                for s in range(args.slices):
                    for name in _rotated(list(populations), s):
                        population, pid = populations[name], targets[name][1]
                        population.run(True)
                        # what was answered while it waited goes on at once: measured after it has settled
                        await asyncio.sleep(args.settle_s)
                        before = cpu_seconds(pid) if pid else 0.0
                        started = time.perf_counter()
                        await asyncio.sleep(args.slice_s)
                        ended = time.perf_counter()
                        cpu[name] += (cpu_seconds(pid) - before) if pid else 0.0
                        population.run(False)
                        windows[name].append((started, ended))
                        active_s[name] += ended - started
                live_rss = {name: rss(pid) for name, (_, pid) in targets.items() if pid}
                for name, population in populations.items():  # turns started inside its measured windows
                    population.turns = [t for t in population.turns
                                        if any(a <= t.started < b for a, b in windows[name])]
                direct_median = _medians(populations["direct"].turns)
                table = {}
                for name, population in populations.items():
                    done = sum(t.ok and any(a <= t.at <= b for a, b in windows[name]) for t in population.turns)
                    table[name] = figures(name, population.turns, done, active_s[name], cpu[name], direct_median)
                    if name != "direct" and table["direct"]["turns_per_s"]:
                        table[name]["capture_cost"] = round(1 - table[name]["turns_per_s"] / table["direct"]["turns_per_s"], 4)
                        # Little's law: N copies, each a turn per cycle (its think, the model's time, what the
                        # target adds); `direct`'s cycle is N over its turns/s. Less noisy than the turns/s ratio.
                        cycle = n / table["direct"]["turns_per_s"]
                        added = (table[name]["added_mean_ms"] or 0.0) / 1e3
                        table[name]["capture_cost_from_latency"] = round(added / (cycle + added), 4)
                    if name in live_rss:
                        table[name]["rss_kib_per_session"] = round((live_rss[name] - idle_rss[name]) / 1024 / n, 1)
                misses = await set_timing(http, url, 0, 0)
                table["model_misses"] = misses["misses"]
                results[f"{timing} n={n}"] = table
                print(json.dumps({f"{timing} n={n}": table}), flush=True)
            for population in populations.values():
                for task in population.tasks:
                    task.cancel()
                await asyncio.gather(*population.tasks, return_exceptions=True)
    return results


def _medians(turns: list[Turn]) -> dict:
    by: dict = defaultdict(list)
    for t in turns:
        if t.ok:
            by[(t.session, t.index)].append(t.seconds)
    return {k: statistics.median(v) for k, v in by.items()}


def _rotated(items: list, by: int) -> list:
    return [items[(by + i) % len(items)] for i in range(len(items))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--sessions", default="96,192,384", help="concurrent session copies per target, in turn")
    parser.add_argument("--timing", default="realistic,instant")
    parser.add_argument("--targets", default="direct,black_box,gate")
    parser.add_argument("--gate-workers", default="", help="also the gate as N workers (gate_wN), e.g. 2")
    parser.add_argument("--gate-off", default="", help="also the gate with each of these accelerators off "
                        "(gate-NAME): fast_lane, lean_client, tiktoken_twin, suffix_writer")
    parser.add_argument("--prefill-tps", type=float, default=10_000.0, help="realistic: prefill tokens/s")
    parser.add_argument("--decode-tps", type=float, default=60.0, help="realistic: decode tokens/s per request")
    parser.add_argument("--slice-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=5.0,
                        help="seconds of each slice before it is measured (copies answered while paused go on at once)")
    parser.add_argument("--slices", type=int, default=3)
    parser.add_argument("--pin", help="A:B: this process and the model on cores A, the targets on cores B")
    parser.add_argument("--model", help="model directory (default: the tiny model with the real Qwen vocabulary)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {int(c) for c in args.pin.split(":")[0].split(",")})
    sessions = load_corpus(args.corpus)
    model = Path(model_or_tiny(args.model))
    logs = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    with contextlib.ExitStack() as stack:
        url, targets = start_all(stack, args, model, logs)
        results = asyncio.run(measure(args, sessions, url, targets))
    results["machine"] = {"cpus": os.cpu_count(), "pin": args.pin, "model": subprocess.run(
        ["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(f"logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
