"""Samples per rollout and the share of sampled tokens trained, before and after lineages, on the same records.

    .venv/bin/python bench/bench_lineage.py test-artifacts/lineage/*.jsonl [--json OUT]

The records are what a run wrote (`rollouts.jsonl`); `tests/e2e/test_subagents.py` and the agents' compaction tests
leave theirs in `test-artifacts/lineage/`. Each rollout's figures under two rules, from the same samples:

- **before**: the rule before chains were recorded. A sample whose chain is not the main one's kind of
  conversation (a different tool list or system prompt: titles, compaction summaries, and the sub-agents of
  Claude Code, OpenCode and Codex, whose tool lists differ from their parents', as the tests check) was auxiliary
  and left out; every other sample trained every token its turns sampled, so a concurrent turn's copy trained its
  parent's tokens again.
- **after**: `trainer.rl.advantages`' default `chain_weights` (summaries and auxiliary calls out, every other kind
  in) over the recorded masks (each sampled token has mask 1 once).

`sampled` counts each token the policy sampled once (the mask-1 tokens of all samples: train-once puts each in
exactly one). `trained share` is the tokens that reach the trainer (counted with repeats) over `sampled`: above 100%
means tokens trained twice, below means sampled tokens thrown away.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from interceptor.store.recorder import read_records
from interceptor.store.records import RolloutRecord
from trainer.rl.advantages import DEFAULT_CHAIN_WEIGHTS

_BEFORE_SIDE = ("auxiliary", "summary", "subagent")  # what the tools-or-system-prompt rule made auxiliary


def figures(record: RolloutRecord) -> dict:
    sampled = sum(sum(s.completion_mask) for s in record.samples)
    spans = [sum(t.completion_end - t.completion_start for t in s.turns) for s in record.samples]
    before = [n for s, n in zip(record.samples, spans) if s.kind not in _BEFORE_SIDE]
    after = [sum(s.completion_mask) for s in record.samples if DEFAULT_CHAIN_WEIGHTS[s.kind] > 0]
    after = [n for n in after if n]
    return {"samples": len(record.samples), "kinds": [s.kind for s in record.samples], "sampled": sampled,
            "before_samples": len(before), "before_tokens": sum(before),
            "after_samples": len(after), "after_tokens": sum(after)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path, help="record files (rollouts.jsonl)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    rows = []
    for path in args.records:
        for record in read_records(path):
            rows.append({"file": path.stem, "rollout": record.rollout_id, **figures(record)})
    print(f"{'run':<24} {'chains':<44} {'sampled':>7}  {'before: samples':>15} {'share':>6}"
          f"  {'after: samples':>14} {'share':>6}")
    for row in rows:
        share = lambda n: f"{100 * n / row['sampled']:.0f}%" if row["sampled"] else "-"  # noqa: E731
        print(f"{row['file']:<24} {','.join(row['kinds']):<44} {row['sampled']:>7}  {row['before_samples']:>15} "
              f"{share(row['before_tokens']):>6}  {row['after_samples']:>14} {share(row['after_tokens']):>6}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
