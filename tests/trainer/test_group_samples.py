"""`build_group`: a finished group of rollouts becomes TRL `RolloutSample`s with group-relative advantages; failed
rollouts are left out with their cause counted (a fault is never a reward), a group without reward variance trains
nothing, and each sample carries the oldest policy version that generated any of its tokens."""

from __future__ import annotations

import pytest

from interceptor.store.records import Failure, RolloutRecord, SampleRecord, TurnRecord
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
