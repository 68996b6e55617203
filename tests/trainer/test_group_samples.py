"""`build_group`: a finished group of rollouts becomes TRL `RolloutSample`s with group-relative advantages; failed
rollouts are left out with their cause counted (a fault is never a reward), a group without reward variance trains
nothing, and each sample carries the oldest policy version that generated any of its tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interceptor.store.records import ChainRecord, Failure, RolloutRecord, SampleRecord, TurnRecord
from trainer.rl.advantages import GroupFilter, build_group


def turn(start: int, versions: int) -> TurnRecord:
    return TurnRecord(prompt_start=start, completion_start=start + 2, completion_end=start + 4, finish_reason="stop",
                      malformed_tool_call=False, model="policy", policy_version=versions, seconds=0.01)


def record(rid: str, reward: float | None, *, versions=(1,), status="ok", failure=None) -> RolloutRecord:
    turns = [turn(4 * i, v) for i, v in enumerate(versions)]
    length = 4 * len(turns)
    mask = [0, 0, 1, 1] * len(turns)
    sample = SampleRecord(index=0, input_ids=list(range(10, 10 + length)), completion_mask=mask,
                          old_logprobs=[-0.5 if m else 0.0 for m in mask], turns=turns, auxiliary=False,
                          fork_reason=None)
    return RolloutRecord(rollout_id=rid, mode="interception_gate", status=status, samples=[sample], trace=[],
                         usage={}, reward=reward, failure=failure)


def test_advantages_are_group_relative_and_failed_rollouts_are_left_out_with_their_cause():
    records = [record("a", 1.0), record("b", 0.0), record("c", 0.0),
               record("d", None, status="failed", failure=Failure(cause="upstream", message="503"))]
    outcome = build_group(records, group_id=7, model_version=1, rules=GroupFilter())
    assert [s.advantage for s in outcome.samples] == pytest.approx([2 ** 0.5, -(2 ** 0.5) / 2, -(2 ** 0.5) / 2],
                                                                   rel=1e-4)
    assert outcome.failures == {"upstream": 1} and outcome.rewards == [1.0, 0.0, 0.0]
    assert all(s.group_id == 7 for s in outcome.samples)


def test_a_group_without_reward_variance_trains_nothing():
    outcome = build_group([record("a", 1.0), record("b", 1.0)], group_id=0, model_version=1, rules=GroupFilter())
    assert not outcome.trained and outcome.dropped == {"zero_variance": 1}


def test_each_sample_carries_the_lowest_policy_version_among_its_turns():
    records = [record("a", 1.0, versions=(3, 4, 4)), record("b", 0.0, versions=(4,))]
    outcome = build_group(records, group_id=0, model_version=2, rules=GroupFilter())
    assert [s.model_version for s in outcome.samples] == [3, 4]  # not the version the group was dispatched at


def tree_record(rid: str, reward: float) -> RolloutRecord:
    """A rollout whose tree holds a main chain, a sub-agent, a compaction summary and a title request."""
    base = record(rid, reward).samples[0]
    kinds = [("main", None), ("subagent", 0), ("summary", 0), ("auxiliary", 0)]
    samples = [replace(base, index=i, auxiliary=kind in ("summary", "auxiliary"),
                       chain=ChainRecord(kind=kind, parent=parent, parent_turn=0 if parent is not None else None,
                                         linked_by="timing" if parent is not None else None))
               for i, (kind, parent) in enumerate(kinds)]  # fmt: skip
    return replace(record(rid, reward), samples=samples)


def test_the_rollouts_advantage_reaches_every_chain_by_its_kinds_weight():
    records = [tree_record("a", 1.0), tree_record("b", 0.0)]
    outcome = build_group(records, group_id=0, model_version=1, rules=GroupFilter())
    assert len(outcome.samples) == 4  # main and sub-agent of each; summaries and titles are out by default
    assert [round(s.advantage, 4) for s in outcome.samples] == [1.0, 1.0, -1.0, -1.0]
    weighted = GroupFilter(chain_weights={"subagent": 0.5, "summary": 1.0})
    outcome = build_group(records, group_id=0, model_version=1, rules=weighted)
    assert [round(s.advantage, 4) for s in outcome.samples] == [1.0, 0.5, 1.0, -1.0, -0.5, -1.0]


def test_a_weight_for_an_unknown_kind_or_below_zero_is_refused():
    with pytest.raises(ValueError, match="unknown kinds \\['subagents'\\]"):
        GroupFilter(chain_weights={"subagents": 1.0})
    with pytest.raises(ValueError, match="chain_weights.summary must be a finite number >= 0"):
        GroupFilter(chain_weights={"summary": -1.0})


def test_a_samples_staleness_is_that_of_the_turns_it_trains_not_those_it_carries():
    sample = record("a", 1.0, versions=(2, 5)).samples[0]
    carried = replace(sample, completion_mask=[0, 0, 0, 0, 0, 0, 1, 1],
                      old_logprobs=[0.0] * 6 + [-0.5, -0.5])  # its first turn is trained in another sample
    records = [replace(record("a", 1.0), samples=[carried]), record("b", 0.0, versions=(5,))]
    outcome = build_group(records, group_id=0, model_version=1, rules=GroupFilter())
    assert [s.model_version for s in outcome.samples] == [5, 5]


def test_each_step_logs_the_trees_size_and_what_of_it_trains():
    from trainer.rl.worker import _group_metrics

    records = [tree_record("a", 1.0), tree_record("b", 0.0)]
    outcome = build_group(records, group_id=0, model_version=1, rules=GroupFilter())
    metrics = _group_metrics(records, outcome, 1, 1)
    assert metrics["rollouts/samples_per_rollout"] == 4.0  # main, sub-agent, summary, title
    assert metrics["rollouts/sampled_tokens_per_rollout"] == 8.0  # 2 sampled tokens in each of the 4
    assert metrics["rollouts/trained_samples_per_rollout"] == 2.0  # the summary and the title are out
    assert metrics["rollouts/trained_tokens_per_rollout"] == 4.0
