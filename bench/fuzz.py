"""Fuzz the interception server from outside: many generated requests, the verdict on every answer, and what the
fuzzing does to a healthy rollout's turn latency.

    .venv/bin/python bench/fuzz.py [--requests 20000] [--concurrency 8] [--seed 0] [--json OUT]

The server (interception_gate over the scripted fake upstream, admin API on) runs in a child process
(`bench/child_server.py`). The parent sends the load from `--concurrency` threads, each with its own connection
and its own seeded generator over the cases of `tests/interceptor/fuzz_inputs.py`, sent and judged by
`fuzz_client.py` (both shared with the property test), so a run is reproducible. A second child process runs one healthy multi-turn rollout after another and times every turn:
first alone, then while the fuzzing runs.

Printed: requests and statuses per route; every answer that breaks the contract (a 5xx, a 4xx not in its
dialect's error shape, a cut-off response), grouped by route and input class, with one example scenario each; the input families
that cost the server most; the distinct exceptions in the server's log; the healthy rollout's turn latency alone
and during the fuzzing, and their ratio.
The exit status is 1 when any answer broke the contract.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
import psutil  # noqa: E402
from child_server import ChildServer  # noqa: E402

from tests.interceptor.fuzz_client import HttpClient, Outcome, run_case  # noqa: E402
from tests.interceptor.fuzz_inputs import Case, any_case  # noqa: E402
from tests.interceptor.fuzz_values import Credentials, RandomSource  # noqa: E402

ADMIN_TOKEN = "admin-token-for-fuzzing"
ROTATE_EVERY = 50  # cases per shared rollout: each request that passes forks a branch, so keep rollouts short
HEALTHY_TURNS = 4  # turns per healthy rollout
BASELINE_TURNS = 400  # healthy turns timed with no fuzzing, for the ratio


# ------------------------------------------------------------------------------------------------- the load


@dataclass
class Tally:
    statuses: Counter = field(default_factory=Counter)  # (route, status) -> answers
    broken: dict = field(default_factory=dict)  # (route, problem, label) -> [count, (example Case, Outcome)]
    cases: int = 0
    pool_requests: int = 0  # opening and finishing the shared rollouts; not counted as fuzz
    seconds: dict = field(default_factory=dict)  # input class -> how long each of its cases took, per request

    def add(self, case: Case, outcomes: list[Outcome], seconds: float) -> None:
        self.cases += 1
        self.seconds.setdefault(case.label, []).append(seconds / max(1, len(outcomes)))
        for o in outcomes:
            self.statuses[(o.step.route, o.status)] += 1
            if o.problem:
                entry = self.broken.setdefault((o.step.route, o.problem, case.label), [0, (case, o)])
                entry[0] += 1

    def merge(self, other: Tally) -> None:
        self.statuses += other.statuses
        self.cases += other.cases
        self.pool_requests += other.pool_requests
        for label, seconds in other.seconds.items():
            self.seconds.setdefault(label, []).extend(seconds)
        for key, (count, example) in other.broken.items():
            self.broken.setdefault(key, [0, example])[0] += count


class Budget:
    """Requests left to send, shared by the fuzzing threads (a case in flight may overshoot it by a few)."""

    def __init__(self, requests: int) -> None:
        self._left = requests
        self._lock = threading.Lock()

    def left(self) -> bool:
        return self._left > 0

    def spend(self, requests: int) -> None:
        with self._lock:
            self._left -= requests


def fuzz_worker(index: int, port: int, seed: int, budget: Budget) -> Tally:
    src = RandomSource(random.Random(f"{seed}:{index}"))
    client = HttpClient(port)
    tally = Tally()
    rollout: Credentials | None = None
    number = 0
    while budget.left():
        case = any_case(src)
        if rollout is None or number % ROTATE_EVERY == 0:
            if rollout is not None:
                tally.pool_requests += 1
                _finish(client, rollout)
            rollout = _open(client)
            tally.pool_requests += 1
        started = time.perf_counter()
        try:
            outcomes = run_case(client, case, rollout)
        except (OSError, http.client.HTTPException) as exc:
            client.close()
            step = case.steps[0]
            outcomes = [Outcome(step, step.path, 0, b"", f"no answer ({type(exc).__name__})")]
        tally.add(case, outcomes, time.perf_counter() - started)
        budget.spend(len(outcomes))
        number += 1
    if rollout is not None:
        _finish(client, rollout)
    client.close()
    return tally


def _open(client: HttpClient) -> Credentials:
    reply = client.request("POST", "/rollouts", b"Bearer " + ADMIN_TOKEN.encode(), b"{}")
    if reply.status != 201:
        raise RuntimeError(f"the admin API refused a plain open: {reply.status} {reply.body[:200]!r}")
    opened = orjson.loads(reply.body)
    return Credentials(opened["id"], opened["secret"], opened["tools_secret"], ADMIN_TOKEN)


def _finish(client: HttpClient, rollout: Credentials) -> int:
    path = f"/rollouts/{rollout.rollout_id}/finish"
    return client.request("POST", path, b"Bearer " + ADMIN_TOKEN.encode(), b'{"status": "ok"}').status


# ------------------------------------------------------------------------------------------ the healthy rollout


def healthy_rollouts(port: int, running, stop, max_turns: int, results) -> None:
    """In its own process: rollouts of HEALTHY_TURNS turns, answered and finished, until `stop` or `max_turns`.
    `running` is set once the first turn is answered."""
    client = HttpClient(port)
    latencies: list[float] = []
    failures: list[str] = []
    while not stop.is_set() and len(latencies) < max_turns:
        rollout = _open(client)
        auth = b"Bearer " + rollout.secret.encode()
        path = f"/rollout/{rollout.rollout_id}/v1/chat/completions"
        messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "task"}]
        for turn in range(HEALTHY_TURNS):
            body = orjson.dumps({"model": "policy", "messages": messages, "max_tokens": 16})
            started = time.perf_counter()
            reply = client.request("POST", path, auth, body)
            latencies.append(time.perf_counter() - started)
            running.set()
            if reply.status != 200:
                failures.append(f"{reply.status} {reply.body[:200]!r}")
                break
            messages += [orjson.loads(reply.body)["choices"][0]["message"], {"role": "user", "content": f"go {turn}"}]
        answer_path = f"/rollout/{rollout.rollout_id}/v1/tools/answer"
        client.request("POST", answer_path, b"Bearer " + rollout.tools_secret.encode(), b'{"answer": "42"}')
        if (status := _finish(client, rollout)) != 200:
            failures.append(f"finish: {status}")
    client.close()
    results.put((latencies, failures))


class HealthyLoop:
    def __init__(self, port: int, *, max_turns: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._running = context.Event()
        self._stop = context.Event()
        self._results = context.Queue()
        self._process = context.Process(
            target=healthy_rollouts, args=(port, self._running, self._stop, max_turns, self._results)
        )

    def __enter__(self) -> HealthyLoop:
        self._process.start()
        if not self._running.wait(60):  # the fuzzing must not start before the rollout it is compared with
            self.__exit__()
            raise RuntimeError("the healthy rollout's first turn did not complete within 60 s")
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._process.join(60)
        if self._process.is_alive():
            self._process.terminate()

    def stop(self) -> None:
        self._stop.set()

    def result(self) -> tuple[list[float], list[str]]:
        """The turn latencies and failures, once the loop has stopped (or reached its turn count)."""
        result = self._results.get(timeout=600)
        self._process.join(60)
        return result


# ----------------------------------------------------------------------------------------------- the report


def latency_row(name: str, latencies: list[float], failures: list[str]) -> dict:
    ordered = sorted(latencies)
    return {
        "run": name,
        "turns": len(ordered),
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
        "worst_ms": ordered[-1] * 1e3,
        "failed": len(failures),
    }


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# exception messages that differ only in a position or the escaped byte are one class
_NUMBER = re.compile(r"(?<=position )\d+")
_SURROGATE = re.compile(r"'\\udc[0-9a-f]{2}'")


def logged_exceptions(log_text: str) -> Counter:
    """(exception line, innermost frame of the repository) -> count, from the tracebacks in the server's log."""
    found: Counter = Counter()
    for block in log_text.split("Traceback (most recent call last):")[1:]:
        lines = block.splitlines()
        frames = [m for m in map(_FRAME.search, lines) if m]
        ours = [m for m in frames if "/site-packages/" not in m.group(1) and "/lib/python" not in m.group(1)]
        where = (ours or frames)[-1] if frames else None
        place = f"{'/'.join(Path(where.group(1)).parts[-2:])}:{where.group(2)} {where.group(3)}" if where else "?"
        final = next((line for line in lines[1:] if line and not line.startswith(" ")), "?")
        final = _SURROGATE.sub(lambda _: r"'\udcXX'", _NUMBER.sub("N", final))
        found[(final[:160], place)] += 1
    return found


def print_report(args, seconds: float, tally: Tally, rss: tuple[int, int], log_text: str, rows: list[dict]) -> None:
    sent = sum(tally.statuses.values())
    print(f"fuzz: {sent:,} requests ({tally.cases:,} cases) in {seconds:.1f} s = {sent / seconds:,.0f}/s, "
          f"{args.concurrency} client threads, seed {args.seed}; +{tally.pool_requests:,} requests opening and "
          f"finishing shared rollouts")
    print(f"server RSS: {rss[0] / 2**20:.0f} MiB before, {rss[1] / 2**20:.0f} MiB after\n")
    routes = sorted({route for route, _ in tally.statuses})
    problems = Counter()
    for (route, _problem, _label), (count, _example) in tally.broken.items():
        problems[route] += count
    print(f"{'route':<14}{'requests':>10}{'2xx':>8}{'4xx':>8}{'5xx':>7}{'other':>7}{'broken':>8}")
    for route in [*routes, "total"]:
        counts = Counter()
        for (r, status), n in tally.statuses.items():
            if route in (r, "total"):
                counts["all"] += n
                counts[f"{status // 100}xx" if 200 <= status < 600 else "other"] += n
        broken = problems[route] if route != "total" else sum(problems.values())
        print(f"{route:<14}{counts['all']:>10,}{counts['2xx']:>8,}{counts['4xx']:>8,}{counts['5xx']:>7,}"
              f"{counts['other'] + counts['3xx']:>7,}{broken:>8,}")

    five = sum(n for (route, status), n in tally.statuses.items() if status >= 500)
    print(f"\n5xx answers: {five:,}   answers breaking the contract: {sum(problems.values()):,} "
          f"in {len(tally.broken)} (route, problem, input class) groups")
    # Shown by input family (the label up to "="), with the values that broke it and one example request.
    families: dict[tuple, list] = {}
    for (route, problem, label), (count, example) in sorted(tally.broken.items()):
        family, _, value = label.partition("=")
        entry = families.setdefault((route, problem, family), [0, [], example])
        entry[0] += count
        if value:
            entry[1].append(value)
    for (route, problem, family), (count, values, (case, outcome)) in families.items():
        print(f"  {route:<13}{problem:<10}{count:>5}  {family}{' = ' + ', '.join(values) if values else ''}")
        for step in case.steps:  # the scenario up to the step that broke, each request as sent
            body = step.body or b""
            mark = "->" if step is outcome.step else "  "
            print(f"     {mark} {step.method} {step.path[:90]}  auth={step.auth}  "
                  f"body ({len(body):,} B): {body[:200]!r}")
            if step is outcome.step:
                break
        print(f"        answer {outcome.status}: {outcome.body[:160]!r}")

    # A request that holds the server's event loop delays every other, so one slow case says little; the median
    # over a family of input classes (the label up to "=") points at the requests that cost the server most.
    families: dict[str, list[float]] = {}
    for label, values in tally.seconds.items():
        families.setdefault(label.split("=")[0], []).extend(values)
    medians = {family: statistics.median(values) for family, values in families.items() if len(values) >= 5}
    print("\ncostliest input families (median ms per request as the client saw it, over N cases):")
    for family, median in sorted(medians.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {median * 1e3:>8.1f}  N={len(families[family]):<5} {family}")

    exceptions = logged_exceptions(log_text)
    if exceptions:
        print("\nexceptions in the server's log (count, exception, innermost repository frame):")
        for (final, place), count in exceptions.most_common():
            print(f"  {count:>6}  {final}\n          at {place}")

    print(f"\nhealthy rollout ({HEALTHY_TURNS} turns each), turn latency:")
    print(f"{'run':<16}{'turns':>7}{'p50 ms':>9}{'p99 ms':>9}{'worst ms':>10}{'failed':>8}")
    for row in rows:
        print(f"{row['run']:<16}{row['turns']:>7}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['worst_ms']:>10.2f}"
              f"{row['failed']:>8}")
    alone, fuzzed = rows
    print(f"{'ratio':<16}{'':>7}{fuzzed['p50_ms'] / alone['p50_ms']:>8.2f}x{fuzzed['p99_ms'] / alone['p99_ms']:>8.2f}x"
          f"{fuzzed['worst_ms'] / alone['worst_ms']:>9.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000, help="fuzz requests to send (default 20000)")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline-turns", type=int, default=BASELINE_TURNS)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="interceptor-fuzz-") as tmp:
        log_path = Path(tmp) / "server.log"
        record_path = Path(tmp) / "rollouts.jsonl"
        with ChildServer(admin_token=ADMIN_TOKEN, record_path=record_path, log_path=log_path) as server:
            process = psutil.Process(server.pid)
            with HealthyLoop(server.port, max_turns=args.baseline_turns) as loop:
                alone = loop.result()
            rss_before = process.memory_info().rss
            budget = Budget(args.requests)
            with HealthyLoop(server.port, max_turns=sys.maxsize) as loop:
                started = time.perf_counter()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    futures = [
                        pool.submit(fuzz_worker, i, server.port, args.seed, budget) for i in range(args.concurrency)
                    ]
                    tally = Tally()
                    for future in futures:
                        tally.merge(future.result())
                seconds = time.perf_counter() - started
                loop.stop()
                fuzzed = loop.result()
            rss_after = process.memory_info().rss
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""

    rows = [latency_row("alone", *alone), latency_row("during fuzzing", *fuzzed)]
    print_report(args, seconds, tally, (rss_before, rss_after), log_text, rows)
    if args.json:
        figures = {
            "requests": sum(tally.statuses.values()),
            "seconds": seconds,
            "statuses": {f"{route} {status}": n for (route, status), n in sorted(tally.statuses.items())},
            "broken": [{"route": r, "problem": p, "label": label, "count": c, "path": o.path, "auth": o.step.auth,
                        "body": (o.step.body or b"")[:2000].decode("utf-8", "replace")}
                       for (r, p, label), (c, (_case, o)) in sorted(tally.broken.items())],
            "healthy": rows,
            "rss_bytes": {"before": rss_before, "after": rss_after},
        }
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if tally.broken else 0


if __name__ == "__main__":
    sys.exit(main())
