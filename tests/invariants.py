"""The invariants of DESIGN.md, checked on a finished rollout record against the calls the policy server saw."""

from __future__ import annotations

import math
import os
from pathlib import Path

from interceptor.store.lineage_audit import audit_lineage
from interceptor.store.records import RolloutRecord
from tests.fakes import Call

__all__ = ["assert_compaction_tree", "assert_token_exact", "chain_tokens", "keep_record"]

ROOT = Path(__file__).resolve().parents[1]


def assert_token_exact(record: RolloutRecord, calls: list[Call]) -> None:
    """Every mask-1 token was sampled by the policy given exactly the tokens before it, with the logprob the
    policy reported; everything else is mask 0 with logprob 0.0; the three arrays have one length. A sampled token
    with mask 0 is trained in an earlier sample with the same ids through it (train once), and the record passes
    the lineage audit."""
    assert audit_lineage(record.samples) == [], audit_lineage(record.samples)
    for sample in record.samples:
        n = len(sample.input_ids)
        assert n == len(sample.completion_mask) == len(sample.old_logprobs), f"sample {sample.index}: lengths"
        sampled_positions = set()
        for turn in sample.turns:
            prompt = sample.input_ids[: turn.completion_start]
            sampled = sample.input_ids[turn.completion_start : turn.completion_end]
            matches = [c for c in calls if c.prompt_ids == prompt and c.token_ids == sampled]
            assert matches, f"sample {sample.index}: turn at {turn.completion_start} was never sampled from that prompt"
            logprobs = sample.old_logprobs[turn.completion_start : turn.completion_end]
            mask = sample.completion_mask[turn.completion_start : turn.completion_end]
            assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) for a, b, m in
                       zip(logprobs, matches[0].logprobs, mask) if m)  # fmt: skip
            sampled_positions.update(range(turn.completion_start, turn.completion_end))
        for i in range(n):
            if i in sampled_positions:
                assert sample.completion_mask[i] == 1 or _trained_before(record, sample.index, i), (
                    f"sample {sample.index}: position {i} should be mask 1 (no earlier sample trains it)")
            else:
                assert sample.completion_mask[i] == 0, f"sample {sample.index}: position {i} should be mask 0"
                assert sample.old_logprobs[i] == 0.0


def _trained_before(record: RolloutRecord, index: int, position: int) -> bool:
    """Whether an earlier sample has the same ids through `position` and trains it."""
    ids = record.samples[index].input_ids[: position + 1]
    return any(s.input_ids[: position + 1] == ids and s.completion_mask[position] == 1
               for s in record.samples[:index] if len(s.input_ids) > position)


def chain_tokens(record: RolloutRecord) -> list[tuple[str, int, int]]:
    """Per sample: its chain's kind, the tokens its turns sampled, and those it trains (mask 1)."""
    return [(s.kind, sum(t.completion_end - t.completion_start for t in s.turns), sum(s.completion_mask))
            for s in record.samples]


def keep_record(record: RolloutRecord, name: str) -> Path:
    """The record in test-artifacts/lineage/NAME.jsonl (or $INTERCEPTOR_TEST_ARTIFACTS/lineage/), where
    bench/bench_lineage.py reads the figures of a run's tree."""
    base = Path(os.environ.get("INTERCEPTOR_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "lineage"
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"{name}.jsonl"
    path.write_bytes(record.to_json() + b"\n")
    return path


def assert_compaction_tree(record: RolloutRecord, main, summary, resumed, *, keep: str) -> None:
    """A compaction as a tree: the summary hangs from the main chain's last turn (found by the history it carries,
    or by timing where the agent serialises that history into one message, as Pi and OpenCode do), the resumed
    chain from the main chain by the summary it carries; each sampled token is trained once."""
    assert main.chain.kind == "main" and main.chain.parent is None, main.chain
    assert (summary.chain.kind, summary.chain.parent, summary.chain.parent_turn) == (
        "summary", main.index, len(main.turns) - 1) and summary.chain.linked_by in ("history", "timing"), summary.chain
    assert (resumed.chain.kind, resumed.chain.parent, resumed.chain.linked_by) == ("compaction", main.index,
                                                                                  "summary"), resumed.chain
    assert audit_lineage(record.samples) == []
    print(f"\nchains (kind, sampled, trained): {chain_tokens(record)}")
    keep_record(record, keep)
