"""`interceptor evaluate`: a checkpoint's success rate on held-out tasks, with its 95% (Wilson) interval.

    interceptor evaluate --config examples/train_smollm2_cpu/submit.toml --tasks runs/submit/tasks/held_out.jsonl \
        --model runs/smollm2 --label before -k 4 --out runs/submit/eval

The agent and its command line, the sampling (`temperature`, `max_tokens`), the concurrency and the upstream come
from the training config, so the held-out rate is measured the way training sampled. With `upstream = "local"` the
checkpoint given by `--model` is served by the local engine in this process; with a vLLM URL, that server must be
serving it (`--model` then gives the tokenizer and chat template).

Each call runs every task `k` times through the same runner, sandbox and host grader as training, writes its
records to `OUT/<label>/rollouts.jsonl`, adds (or replaces) its label's entry in `OUT/eval.json` and redraws
`OUT/eval.png` (every entry: rate and interval). A rollout that failed (its agent crashed, the upstream broke, a
limit was hit) is neither a success nor a failure: it is counted by cause and left out of the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Rate", "add_evaluate_arguments", "evaluate", "run_evaluate_from_args", "wilson"]

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Rate:
    successes: int
    trials: int

    @property
    def value(self) -> float:
        return self.successes / self.trials if self.trials else math.nan

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson(self.successes, self.trials)


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (it stays inside [0, 1] and is not empty at 0 or n)."""
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, not {successes}/{trials}")
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    scale = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / scale
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / scale
    return (max(0.0, center - half), min(1.0, center + half))


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the training config (TOML): agent, command, sampling")
    parser.add_argument("--tasks", required=True, help="the held-out task file")
    parser.add_argument("--model", required=True, help="the checkpoint to evaluate (a model directory)")
    parser.add_argument("--label", default=None, help="its name in eval.json (default: the model directory's name)")
    parser.add_argument("-k", type=int, default=4, help="rollouts per task")
    parser.add_argument("--out", required=True, help="where eval.json, eval.png and the records go")
    parser.add_argument("--success", type=float, default=1.0, help="a reward at least this is a success")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key of the config")


async def evaluate(config, *, tasks: Path, model: Path, label: str, k: int, out: Path,
                   success: float = 1.0) -> dict:
    """Run every held-out task `k` times on `model` and return (and record in `out/eval.json`) its entry."""
    from agents.runner import RunnerConfig
    from agents.sources import load_tasks
    from interceptor import SamplingSettings

    from trainer.policy_stack import PolicyStack, StackConfig
    from trainer.run_main import progress_printer
    from trainer.train_main import agent_spec

    if k < 1:
        raise ValueError("k must be at least 1")
    if not (Path(model) / "config.json").is_file():
        raise ValueError(f"{model} is not a model directory (no config.json)")
    held_out = load_tasks(tasks)
    records_dir = out / label
    records_dir.mkdir(parents=True, exist_ok=True)
    record_path = records_dir / "rollouts.jsonl"
    record_path.unlink(missing_ok=True)
    stack_config = StackConfig(upstream=config.upstreams, model=model,
                               build_local_model=False, record_path=record_path, seed=config.seed)

    def runner_config(server) -> RunnerConfig:
        return RunnerConfig(agent=agent_spec(config, context_window=server.policy.max_model_len),
                            sampling=SamplingSettings(temperature=config.temperature, max_tokens=config.max_tokens),
                            concurrency=config.concurrency)

    started = time.perf_counter()
    options = {"on_finished": progress_printer(len(held_out) * k)}
    async with PolicyStack(stack_config, runner=runner_config, runner_options=options) as stack:
        records = await stack.runner.run_tasks(held_out, n=k)
    graded = [r for r in records if r.status == "ok" and r.reward is not None]
    rate = Rate(sum(r.reward >= success for r in graded), len(graded))
    entry = {
        "label": label, "model": str(Path(model).resolve()), "tasks": str(Path(tasks).resolve()),
        "task_count": len(held_out), "k": k, "rollouts": len(records), "graded": rate.trials,
        "successes": rate.successes, "rate": rate.value if rate.trials else None, "ci95": list(rate.ci95),
        "mean_reward": sum(r.reward for r in graded) / len(graded) if graded else None,
        "failed": dict(Counter(r.failure.cause for r in records if r.failure is not None)),
        "temperature": config.temperature, "max_tokens": config.max_tokens, "agent": config.agent,
        "command": config.command if config.agent == "command" else None,
        "seconds": round(time.perf_counter() - started, 1), "records": str(record_path),
    }
    _record(out, entry)
    return entry


def _record(out: Path, entry: dict) -> None:
    path = out / "eval.json"
    entries = json.loads(path.read_text()) if path.is_file() else []
    entries = [e for e in entries if e["label"] != entry["label"]] + [entry]
    path.write_text(json.dumps(entries, indent=2) + "\n")
    plot(entries, out / "eval.png")


def plot(entries: list[dict], path: Path) -> None:
    """Each entry's rate with its 95% interval, in the order they were added (matplotlib, when installed)."""
    import importlib.util

    entries = [e for e in entries if e["rate"] is not None]  # nothing graded: no point to draw
    if not entries or importlib.util.find_spec("matplotlib") is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(1.2 * len(entries) + 3, 3.5))
    xs = range(len(entries))
    rates = [e["rate"] for e in entries]
    below = [e["rate"] - e["ci95"][0] for e in entries]
    above = [e["ci95"][1] - e["rate"] for e in entries]
    axis.errorbar(xs, rates, yerr=[below, above], fmt="o", capsize=6)
    axis.set_xticks(list(xs), [f"{e['label']}\n{e['successes']}/{e['graded']}" for e in entries])
    axis.set_ylabel("held-out success (95% Wilson)")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run_evaluate_from_args(args: argparse.Namespace) -> int:
    from trainer.models.local_model import LOCAL_MODEL_ERRORS, local_model_error_exit
    from trainer.train_main import TrainConfig

    try:
        config = TrainConfig.load(args.config, args.set or ())
        if args.k < 1:
            raise ValueError("-k must be at least 1")
        if not (Path(args.model) / "config.json").is_file():
            raise ValueError(f"--model {args.model} is not a model directory (no config.json)")
    except (OSError, ValueError) as exc:
        print(f"interceptor evaluate: error: {exc}", file=sys.stderr)
        return 2
    label = args.label or Path(args.model).resolve().name
    try:
        entry = asyncio.run(evaluate(config, tasks=Path(args.tasks), model=Path(args.model), label=label, k=args.k,
                                     out=Path(args.out), success=args.success))
    except LOCAL_MODEL_ERRORS as exc:
        return local_model_error_exit("evaluate", exc)
    low, high = entry["ci95"]
    failed = ", ".join(f"{c} {n}" for c, n in entry["failed"].items()) or "none"
    rate = f"{entry['rate']:.3f}" if entry["rate"] is not None else "-"
    print(f"{label}: {entry['successes']}/{entry['graded']} = {rate} (95% CI {low:.3f}-{high:.3f}); "
          f"failed rollouts: {failed}; {entry['seconds']:.0f}s")
    print(f"results: {Path(args.out) / 'eval.json'}; plot: {Path(args.out) / 'eval.png'}")
    return 0
