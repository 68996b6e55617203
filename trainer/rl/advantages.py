"""From a group's finished rollouts to TRL `RolloutSample`s: filtering and group-relative advantages.

- Rollouts that did not end `ok` (an infrastructure fault, a timeout) are left out: they have no reward, and
  never get one.
- A group with fewer than two graded rollouts, or (when configured) with zero reward variance, or whose rollouts
  were cut by the length limit (when configured) trains nothing; each case is counted.
- Advantage: `(r - mean) / (std + eps)` over the group's graded rollouts (TRL's trainer uses it as given). Every
  sample of a rollout (forks included) carries its rollout's advantage; auxiliary samples (title requests and other
  side calls) are left out unless configured.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from interceptor.store.records import RolloutRecord

__all__ = ["GroupFilter", "GroupOutcome", "build_group"]


@dataclass(frozen=True, kw_only=True)
class GroupFilter:
    drop_zero_variance: bool = True
    drop_truncated: bool = False  # leave out rollouts with a turn cut by the length limit
    include_auxiliary: bool = False
    eps: float = 1e-6
    min_graded: int = 2


@dataclass(kw_only=True)
class GroupOutcome:
    samples: list  # trl RolloutSample
    rewards: list[float]
    dropped: Counter = field(default_factory=Counter)  # why rollouts or the whole group trained nothing
    failures: Counter = field(default_factory=Counter)  # failed rollouts by cause

    @property
    def trained(self) -> bool:
        return bool(self.samples)


def _truncated(record: RolloutRecord) -> bool:
    return any(turn.finish_reason == "length" for sample in record.samples for turn in sample.turns)


def build_group(
    records: list[RolloutRecord], *, group_id: int, model_version: int, rules: GroupFilter
) -> GroupOutcome:
    """The group's samples with group-relative advantages. Each sample's `model_version` is the lowest policy
    version among its turns (what TRL's staleness bound needs: its oldest token), `model_version` (the version the
    group was dispatched at) for a sample without turns."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    outcome = GroupOutcome(samples=[], rewards=[])
    graded = []
    for record in records:
        if record.status != "ok" or record.reward is None:
            outcome.failures[record.failure.cause if record.failure else record.status] += 1
            continue
        if rules.drop_truncated and _truncated(record):
            outcome.dropped["truncated"] += 1
            continue
        graded.append(record)
    outcome.rewards = [r.reward for r in graded]
    if len(graded) < rules.min_graded:
        outcome.dropped["too_few_graded"] += 1
        return outcome
    mean = statistics.fmean(outcome.rewards)
    std = statistics.pstdev(outcome.rewards)
    if rules.drop_zero_variance and std == 0.0:
        outcome.dropped["zero_variance"] += 1
        return outcome
    now = time.time()
    for record in graded:
        advantage = (record.reward - mean) / (std + rules.eps)
        for sample in record.samples:
            if sample.auxiliary and not rules.include_auxiliary:
                continue
            if not any(sample.completion_mask):
                continue
            outcome.samples.append(
                RolloutSample(
                    prompt=[],
                    completion=[],
                    input_ids=np.asarray(sample.input_ids, dtype=np.int64),
                    completion_mask=np.asarray(sample.completion_mask, dtype=np.int64),
                    old_log_probs=np.asarray(sample.old_logprobs, dtype=np.float32),
                    advantage=float(advantage),
                    # The oldest policy that generated any of its tokens (the gate stamps each turn); the dispatch
                    # version when a sample has none recorded.
                    model_version=min((t.policy_version for t in sample.turns), default=model_version),
                    group_id=group_id,
                    metrics={"reward": float(record.reward), "forks": float(record.forks)},
                    enqueued_at=now,
                )
            )
    return outcome
