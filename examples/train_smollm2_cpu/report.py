"""One report of a recipe run: reward per step, the trainer-engine logprob gap per step, seconds per step and per
weight sync (from `RUN/train/metrics.jsonl`), held-out success before and after (from `RUN/eval/eval.json`), and,
where the run was rescored (`SERVE=vllm run.sh`), the gap of the records to the policy server (`RUN/rescore.json`).

    python examples/train_smollm2_cpu/report.py runs/smollm2/submit-seed1

writes `RUN/report.json` and `RUN/report.png`, and prints the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def per_step(metrics: Path) -> list[dict]:
    """The last logged value of each key at each step (TRL logs a step once, the worker's metrics with it)."""
    steps: dict[int, dict] = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], {}).update(row)
    return [steps[s] for s in sorted(steps) if "rollouts/reward_mean" in steps[s] or "loss" in steps[s]]


def main(run: Path) -> int:
    rows = per_step(run / "train" / "metrics.jsonl")
    evals = json.loads((run / "eval" / "eval.json").read_text()) if (run / "eval" / "eval.json").is_file() else []
    keys = {"reward": "rollouts/reward_mean", "gap_max": "logprob_gap/max", "gap_mean": "logprob_gap/mean",
            "sync_s": "perf/weight_sync_s"}
    parts = ("perf/rollout_wait_s", "perf/fwd_bwd_s", "perf/optimizer_s", "perf/weight_sync_s")  # a step's seconds
    steps = [{"step": r["step"], **{name: r.get(key) for name, key in keys.items()},
              "step_s": sum(r.get(p) or 0.0 for p in parts), "rollout_wait_s": r.get("perf/rollout_wait_s")}
             for r in rows]
    report = {"run": str(run), "steps": steps, "held_out": [
        {k: e[k] for k in ("label", "successes", "graded", "rate", "ci95", "failed", "model")} for e in evals]}
    if (run / "rescore.json").is_file():
        rescored = json.loads((run / "rescore.json").read_text())
        report["rescore"] = {"upstream": rescored["upstream"], "model": rescored["model"],
                             "samples": sum(r["samples"] for r in rescored["rollouts"]), **rescored["overall"],
                             "skipped": len(rescored["skipped"])}
    (run / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'step':>4} {'reward':>7} {'gap max':>9} {'gap mean':>9} {'sync s':>7} {'step s':>7}")
    for s in steps:
        cells = [f"{s[k]:.4g}" if isinstance(s[k], (int, float)) else "-" for k in (*keys, "step_s")]
        print(f"{s['step']:>4} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, (7, 9, 9, 7, 7), strict=True)))
    for e in report["held_out"]:
        rate = "-" if e["rate"] is None else f"{e['rate']:.3f}"
        print(f"held-out {e['label']}: {e['successes']}/{e['graded']} = {rate} "
              f"(95% CI {e['ci95'][0]:.3f}-{e['ci95'][1]:.3f})")
    if "rescore" in report:
        r = report["rescore"]
        print(f"rescored on {r['model']}: {r['tokens']} sampled tokens of {r['samples']} samples, max gap "
              f"{r['max']:.3g}, p99 {r['p99']:.3g}; {r['skipped']} skipped")
    _plot(report, run / "report.png")
    print(f"report: {run / 'report.json'}, {run / 'report.png'}")
    return 0


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report["steps"]
    figure, (reward, gap, held) = plt.subplots(1, 3, figsize=(13, 3.6))
    xs = [s["step"] for s in steps]
    reward.plot(xs, [s["reward"] for s in steps], marker="o")
    reward.set(title="mean reward of the step's groups", xlabel="step", ylim=(-0.05, 1.05))
    gaps = [(s["step"], s["gap_max"]) for s in steps if s["gap_max"]]
    if gaps:
        gap.semilogy(*zip(*gaps, strict=True), marker="o")
    gap.axhline(1e-4, color="grey", linestyle="--", linewidth=1)
    gap.set(title="max |trainer - sampled| logprob\n(samples up to max_staleness old)", xlabel="step")
    entries = report["held_out"]
    held.errorbar(range(len(entries)), [e["rate"] or 0 for e in entries], capsize=6, fmt="o",
                  yerr=[[(e["rate"] or 0) - e["ci95"][0] for e in entries],
                        [e["ci95"][1] - (e["rate"] or 0) for e in entries]])
    held.set_xticks(range(len(entries)), [f"{e['label']}\n{e['successes']}/{e['graded']}" for e in entries])
    held.set(title="held-out success (95% Wilson)", ylim=(-0.02, 1.02))
    for axis in (reward, gap, held):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
