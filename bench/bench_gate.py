"""Latency each proxy adds per chat turn, and its throughput, from a separate load generator, in one interleaved run.

    scripts/setup-bench.sh              # once: verifiers in bench/.venv-peers, LiteLLM in bench/.venv-litellm
    python bench/bench_gate.py [--turns 200] [--rollouts 64,256,1000] [--seconds 6] [--steps ...] [--json OUT]
    python bench/bench_gate.py --targets gate --steps throughput --rollouts 64 --gate-workers 1,2   # scaling

Processes (each its own, started here, stopped at the end): an instant fake upstream (bench/peers/fake_upstream.py),
Interceptor in `interception_gate` (recording, as in training) and in `black_box`, verifiers' interception server
(bench/peers/verifiers_server.py) and LiteLLM's proxy (bench/peers/litellm_server.py), the peers where installed.
This process is only the load generator (aiohttp). Targets: `direct` (chat completions straight to the fake
upstream), `direct_tokens` (its `/v1/completions` with as many prompt ids as the gate's last prompt: what the gate
itself sends upstream), `gate`, `black_box`, `verifiers`, `litellm`.

Every turn is a tool-loop turn as agents send it: the whole history, 10 tools, and the model's answer is a tool call
whose result the agent appends. Every target gets the same conversation, and every measure runs the targets round
robin, turn by turn (the order rotating each round), so machine noise hits them alike.
- latency: rollouts grown to ~1k and ~32k tokens of history, then steady turns (fresh rollouts every `--segment`
  turns, so the history stays near its size); p50/p99, added ms = target - `direct` in the same round for every
  target, the ratios of added ms to verifiers', and the gate's `over_tokens_call` (gate - `direct_tokens`) beside.
  `--idle-ms` sleeps after each round: each turn then starts with cold caches, as in the interleaved run. `--gap-ms` sleeps before every turn: each target then starts on idle cores,
  so work a proxy does after its answer (the gate readies the next turn once the answer is out) and a heavy peer's
  after-work (LiteLLM's) do not land on the next target's clock, as they do back to back.
- flatness: one rollout per target, `--flat-turns` turns of ~130 tokens each; the median of turns 1-8 vs the last 8.
- throughput: N concurrent rollouts of up to 16 turns each (then a fresh one), for `--seconds` per target, split in
  `--slices` slices taken in turn; turns/s and the ratio to verifiers. With `--gate-workers 1,2`, the gate also runs
  as `interceptor serve --workers N` for each N above 1 (target `gate_wN`, throughput only; rollouts opened through
  its front, turns sent to their worker); N = 1 is the `gate` row itself.
- first turn: fresh rollouts whose first request carries ~32k tokens, sent one after the other in windows of
  FIRST_TURNS_PER_WINDOW, while `--steady-rollouts` rollouts (~1k history, 5-15 ms of "tool time" between turns) run;
  the big turns' latency, and the steady turns' p50/p99 while they ran vs the second before (and how many turns).
  `direct` runs it too (no proxy between): its p99 ratio is what the big requests alone do to the steady ones.
The fake upstream answers at once: these figures measure the proxies, not a model. All processes share the machine's
cores (2 here), so a busy proxy also slows the load generator: compare ratios within a run, not across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.agent import TOKENS_PER_LINE, Conversation, chat_turn, open_conversation, tokens_turn  # noqa: E402
from peers.launch import Target, start_sharded_gates, start_targets  # noqa: E402
from peers.table import METHOD, print_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEERS_PYTHON = ROOT / "bench" / ".venv-peers" / "bin" / "python"  # verifiers (scripts/setup-bench.sh)
LITELLM_PYTHON = ROOT / "bench" / ".venv-litellm" / "bin" / "python"  # apart: its pins conflict with verifiers'
MODEL_CACHE = Path.home() / ".cache" / "interceptor" / "bench-tiny-real-vocab"
ROLLOUT_TURNS = 16  # throughput: a rollout's length before a fresh one replaces it
STEADY_TOOL_S = 0.01  # first turn: the steady rollouts' mean tool time between turns (5-15 ms)
FIRST_TURNS_PER_WINDOW = 10  # first turn: big requests sent back to back in one window, the windows rotating targets


def rotated(items: Sequence, by: int) -> list:
    return [items[(by + i) % len(items)] for i in range(len(items))]


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------------------------------------ latency


@dataclass
class Samples:
    seconds: dict[str, list[float]] = field(default_factory=dict)
    history: list[int] = field(default_factory=list)

    def add(self, name: str, value: float) -> None:
        self.seconds.setdefault(name, []).append(value)


async def grow(http: aiohttp.ClientSession, convos: list[Conversation], history_tokens: int) -> None:
    """Append big tool results, the same to every conversation, until the history is about `history_tokens`:
    as the gate counts it when the gate is among them (its count is exact), else as the first target estimates."""
    measure = _measure(convos)
    lines = 1
    while True:
        for convo in convos:
            await chat_turn(http, convo, lines)
        missing = history_tokens - measure.prompt_tokens - lines * TOKENS_PER_LINE
        if missing <= 0:
            return
        lines = max(1, min(4000, missing) // TOKENS_PER_LINE)


async def timed_round(http: aiohttp.ClientSession, convos: list[Conversation], upstream: str, by: int,
                      result_lines: int, samples: Samples, *, gap_s: float = 0.0) -> None:
    """One turn of every conversation, and the gate's own upstream call (`direct_tokens`, as long as the gate's
    last prompt), in an order rotated by `by`; `gap_s` of sleep before each."""
    gate = next((c for c in convos if c.target.name == "gate"), None)
    order: list[Conversation | None] = [*convos, None] if gate is not None else list(convos)
    for convo in rotated(order, by):
        if gap_s:
            await asyncio.sleep(gap_s)
        if convo is None:
            assert gate is not None
            samples.add("direct_tokens", await tokens_turn(http, upstream, max(1, gate.prompt_tokens)))
        else:
            samples.add(convo.target.name, await chat_turn(http, convo, result_lines))
    samples.history.append(_measure(convos).prompt_tokens)


def _measure(convos: list[Conversation]) -> Conversation:
    """Whose prompt-token count stands for all: the gate's (exact), else the first target's (an estimate)."""
    return next((c for c in convos if c.target.name == "gate"), convos[0])


BASELINE = "direct"  # every target's added time is taken against what the agent would see calling the model itself


async def latency(http: aiohttp.ClientSession, targets: list[Target], upstream: str, args: argparse.Namespace,
                  history_tokens: int) -> Samples:
    samples = Samples()
    done = 0
    while done < args.turns:
        convos = [await open_conversation(http, target) for target in targets]
        await grow(http, convos, history_tokens)
        for _ in range(min(args.segment, args.turns - done)):
            await timed_round(http, convos, upstream, done, 1, samples, gap_s=args.gap_ms / 1000)
            done += 1
            if args.idle_ms:  # every process idle between rounds: each turn then starts with cold caches
                await asyncio.sleep(args.idle_ms / 1000)
        for convo in convos:
            await convo.target.close(http, convo.endpoint)
    return samples


def latency_figures(samples: Samples) -> dict:
    figures: dict = {"history_tokens": [min(samples.history, default=0), max(samples.history, default=0)]}
    base = samples.seconds.get(BASELINE, [])
    tokens_call = samples.seconds.get("direct_tokens", [])
    for name, values in samples.seconds.items():
        row = {"p50_ms": pct(values, 0.5) * 1e3, "p99_ms": pct(values, 0.99) * 1e3}
        if name not in (BASELINE, "direct_tokens") and base:
            added = [t - d for t, d in zip(values, base)]  # paired: the same round
            row |= {"added_p50_ms": pct(added, 0.5) * 1e3, "added_p99_ms": pct(added, 0.99) * 1e3}
        if name == "gate" and tokens_call:  # named beside it: the gate's time beyond its own token-id call upstream
            row["over_tokens_call_p50_ms"] = pct([t - d for t, d in zip(values, tokens_call)], 0.5) * 1e3
        figures[name] = row
    for name in ("gate", "black_box"):
        ours, theirs = figures.get(name, {}), figures.get("verifiers", {})
        for q in ("p50", "p99"):
            if f"added_{q}_ms" in ours and theirs.get(f"added_{q}_ms", 0) > 0:
                figures[name][f"{q}_vs_verifiers"] = ours[f"added_{q}_ms"] / theirs[f"added_{q}_ms"]
    return figures


# ------------------------------------------------------------------------------------------------ flatness


async def flatness(http: aiohttp.ClientSession, targets: list[Target], upstream: str, turns: int) -> dict:
    """One long tool loop per target; the median of its first 8 turns vs its last 8."""
    convos = [await open_conversation(http, target) for target in targets]
    samples = Samples()
    for turn in range(turns):
        await timed_round(http, convos, upstream, turn, 6, samples)
    for convo in convos:
        await convo.target.close(http, convo.endpoint)
    ends = {name: (statistics.median(values[:8]), statistics.median(values[-8:]))
            for name, values in samples.seconds.items()}
    figures: dict = {"history_tokens": [min(samples.history, default=0), max(samples.history, default=0)]}
    for name, (first, last) in ends.items():
        row = {"first_ms": first * 1e3, "last_ms": last * 1e3, "ratio": last / first}
        if name not in (BASELINE, "direct_tokens") and BASELINE in ends:
            base_first, base_last = ends[BASELINE]
            row["added_ratio"] = (last - base_last) / (first - base_first)  # the proxy's own part, end vs start
        figures[name] = row
    return figures


# ------------------------------------------------------------------------------------------------ throughput


async def open_pool(http: aiohttp.ClientSession, target: Target, rollouts: int) -> list[Conversation]:
    """`rollouts` conversations, opened concurrently before the clock starts (a trainer opens its batch up front)."""
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(open_conversation(http, target, task_lines=20)) for _ in range(rollouts)]
    return [task.result() for task in tasks]


async def throughput(http: aiohttp.ClientSession, targets: list[Target], rollouts: int, seconds: float,
                     slices: int) -> dict:
    pools = {target.name: await open_pool(http, target, rollouts) for target in targets}
    turns = {t.name: 0 for t in targets}
    spent = {t.name: 0.0 for t in targets}

    async def drive(target: Target, pool: list[Conversation], index: int, deadline: float) -> None:
        while time.perf_counter() < deadline:
            if pool[index].turns >= ROLLOUT_TURNS:  # finished: a fresh rollout takes its place, on the clock
                await target.close(http, pool[index].endpoint)
                pool[index] = await open_conversation(http, target, task_lines=20)
            await chat_turn(http, pool[index], 4)
            turns[target.name] += 1

    for slice_index in range(slices):
        for target in rotated(targets, slice_index):
            started = time.perf_counter()
            deadline = started + seconds / slices
            async with asyncio.TaskGroup() as group:
                for index in range(rollouts):
                    group.create_task(drive(target, pools[target.name], index, deadline))
            spent[target.name] += time.perf_counter() - started
    for target in targets:
        async with asyncio.TaskGroup() as group:  # the gate writes (and fsyncs) each record: not one at a time
            for convo in pools[target.name]:
                group.create_task(target.close(http, convo.endpoint))
    figures = {name: {"turns": turns[name], "seconds": spent[name], "turns_per_s": turns[name] / spent[name]}
               for name in turns}
    if "verifiers" in figures:
        for row in figures.values():
            row["vs_verifiers"] = row["turns_per_s"] / figures["verifiers"]["turns_per_s"]
    return figures


# ------------------------------------------------------------------------------------------------ first turn


async def first_turn_window(http: aiohttp.ClientSession, target: Target, big_lines: int, bigs: int,
                            steady_rollouts: int, quiet_s: float) -> tuple[list[float], int, list[float], list[float]]:
    """`steady_rollouts` rollouts (~1k history, STEADY_TOOL_S of tool time between turns) run for `quiet_s`, then
    `bigs` fresh rollouts send their big first request one after the other (each closed when answered). The big
    turns' seconds, the prompt tokens of the last, and the steady turns' seconds before and during the big ones."""
    steady = [await open_conversation(http, target) for _ in range(steady_rollouts)]
    await grow(http, steady, 1000)
    spans: list[tuple[float, float]] = []
    stop = asyncio.Event()

    async def steady_loop(convo: Conversation, index: int) -> None:
        tool_time = random.Random(index)  # jittered, so that the steady rollouts do not fall into step
        while not stop.is_set():
            started = time.perf_counter()
            await chat_turn(http, convo, 1)
            spans.append((started, time.perf_counter()))
            await asyncio.sleep(STEADY_TOOL_S * (0.5 + tool_time.random()))

    big_seconds: list[float] = []
    async with asyncio.TaskGroup() as group:  # the steady loops end with the big turns (or are cancelled on a failure)
        for index, convo in enumerate(steady):
            group.create_task(steady_loop(convo, index))
        try:
            await asyncio.sleep(quiet_s)
            window_started = time.perf_counter()
            for _ in range(bigs):
                big = await open_conversation(http, target, task_lines=big_lines)
                big_seconds.append(await chat_turn(http, big, 1))
                await target.close(http, big.endpoint)
            window_ended = time.perf_counter()
        finally:
            stop.set()
    for convo in steady:
        await target.close(http, convo.endpoint)
    quiet = [e - s for s, e in spans if e < window_started]
    loaded = [e - s for s, e in spans if s < window_ended and e > window_started]
    return big_seconds, big.prompt_tokens, quiet, loaded


async def first_turn(http: aiohttp.ClientSession, targets: list[Target], args: argparse.Namespace) -> dict:
    results: dict[str, dict[str, list]] = {t.name: {"big": [], "tokens": [], "quiet": [], "loaded": []}
                                           for t in targets}
    for window, first in enumerate(range(0, args.first_turns, FIRST_TURNS_PER_WINDOW)):
        for target in rotated(targets, window):
            count = min(FIRST_TURNS_PER_WINDOW, args.first_turns - first)
            big, tokens, quiet, loaded = await first_turn_window(http, target, args.first_tokens // TOKENS_PER_LINE,
                                                                 count, args.steady_rollouts, 1.0)
            row = results[target.name]
            for key, values in (("big", big), ("tokens", [tokens]), ("quiet", quiet), ("loaded", loaded)):
                row[key] += values

    def ms(values: list[float], q: float) -> float | None:  # None when no steady turn fell in that phase
        return pct(values, q) * 1e3 if values else None

    return {name: {"first_turn_p50_ms": ms(row["big"], 0.5), "first_turn_max_ms": max(row["big"]) * 1e3,
                   "first_prompt_tokens": max(row["tokens"]) if name == "gate" else None,  # only the gate's is exact
                   "steady_p50_quiet_ms": ms(row["quiet"], 0.5), "steady_p50_during_ms": ms(row["loaded"], 0.5),
                   "steady_p99_quiet_ms": ms(row["quiet"], 0.99), "steady_p99_during_ms": ms(row["loaded"], 0.99),
                   "p99_ratio": pct(row["loaded"], 0.99) / pct(row["quiet"], 0.99) if row["loaded"] and row["quiet"]
                   else None,
                   "steady_turns_quiet": len(row["quiet"]), "steady_turns_during": len(row["loaded"])}
            for name, row in results.items()}


# ------------------------------------------------------------------------------------------------ set-up


def ensure_model(model: Path | None) -> Path:
    if model is not None:
        return model
    if not (MODEL_CACHE / "tokenizer.json").exists():  # make_tiny_model moves a complete model into place
        # built in a short-lived process: torch is imported there, never in the load generator
        code = ("import sys; from pathlib import Path; from trainer.models.tiny_model import TinyModelSpec, make_tiny_model; "
                "make_tiny_model(Path(sys.argv[1]), TinyModelSpec(real_vocab=True))")
        subprocess.run([sys.executable, "-c", code, str(MODEL_CACHE)], cwd=ROOT, check=True)
    return MODEL_CACHE


async def run(args: argparse.Namespace, logs: Path) -> dict:
    results: dict = {}
    model = ensure_model(args.model)
    with start_targets(set(args.targets.split(",")), model=model, logs=logs, peers_python=PEERS_PYTHON,
                       litellm_python=LITELLM_PYTHON) as (upstream, targets), contextlib.ExitStack() as sharded:
        scaling = start_sharded_gates(sharded, upstream, model, logs, args.gate_workers)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=300)) as http:
            steps: list[tuple[str, Callable]] = [
                *((f"latency_{h // 1000}k", lambda h=h: latency(http, targets, upstream, args, h))
                  for h in args.histories),
                ("flatness", lambda: flatness(http, targets, upstream, args.flat_turns)),
                *((f"throughput_{n}", lambda n=n: throughput(http, [*targets, *scaling], n, args.seconds,
                                                             args.slices))
                  for n in args.rollouts),
                (f"first_turn_{args.first_tokens // 1000}k",
                 lambda: first_turn(http, targets, args)),
            ]
            for name, step in steps:
                if name.rsplit("_", 1)[0] not in args.steps:
                    continue
                started = time.perf_counter()
                figures = await step()
                if isinstance(figures, Samples):
                    figures = {**latency_figures(figures), "gap_ms": args.gap_ms, "idle_ms": args.idle_ms}
                results[name] = figures
                print(f"[{time.perf_counter() - started:5.1f}s] {name} done", file=sys.stderr, flush=True)
    return results


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model, real Qwen vocabulary)")
    parser.add_argument("--targets", default=None,
                        help="proxies to start, of gate,black_box,verifiers,litellm (default: those installed)")
    parser.add_argument("--histories", type=_ints, default=[1_000, 32_000], help="latency: history sizes in tokens")
    parser.add_argument("--turns", type=int, default=200, help="latency: steady turns per history size")
    parser.add_argument("--segment", type=int, default=20, help="latency: steady turns per rollout")
    parser.add_argument("--idle-ms", type=float, default=0.0,
                        help="latency: idle time after each round (e.g. 20: what the other proxies' turns do to the "
                             "caches of a target measured alone)")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="latency: sleep before every turn (e.g. 5: each target starts on idle cores)")
    parser.add_argument("--flat-turns", type=int, default=256)
    parser.add_argument("--rollouts", type=_ints, default=[64, 256],
                        help="throughput: concurrent rollouts (e.g. 64,256,1000)")
    parser.add_argument("--seconds", type=float, default=6.0, help="throughput: seconds per target and rollout count")
    parser.add_argument("--slices", type=int, default=3, help="throughput: slices each target's seconds are cut in")
    parser.add_argument("--gate-workers", type=_ints, default=[],
                        help="throughput: also the gate with these worker counts (e.g. 1,2): a row gate_wN per N "
                             "above 1; 1 is the gate row itself (added to --targets)")
    parser.add_argument("--first-tokens", type=int, default=32_000, help="first turn: the big request's size")
    parser.add_argument("--first-turns", type=int, default=20, help="first turn: big first requests per target")
    parser.add_argument("--steady-rollouts", type=int, default=4,
                        help="first turn: steady rollouts running meanwhile, whose p99 is measured")
    parser.add_argument("--steps", type=lambda text: set(text.split(",")),
                        default={"latency", "flatness", "throughput", "first_turn"}, help="which measures to run")
    parser.add_argument("--logs", type=Path, help="keep the servers' logs and records here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.first_turns < 1 or args.steady_rollouts < 1:
        parser.error("--first-turns and --steady-rollouts must be at least 1")
    if args.targets is None:
        installed = {"verifiers": PEERS_PYTHON.exists(), "litellm": LITELLM_PYTHON.exists()}
        args.targets = ",".join(["gate", "black_box", *(name for name, ok in installed.items() if ok)])
        for name in (name for name, ok in installed.items() if not ok):
            print(f"{name} is not installed (scripts/setup-bench.sh): left out", file=sys.stderr)
    if 1 in args.gate_workers and "gate" not in args.targets.split(","):
        args.targets += ",gate"
    with contextlib.ExitStack() as stack:
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-gate-")))
        logs.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        results = asyncio.run(run(args, logs))
    results["meta"] = {"seconds": round(time.perf_counter() - started, 1), "method": METHOD}
    print_table({k: v for k, v in results.items() if k != "meta"})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
