"""From a group's finished rollouts to TRL `RolloutSample`s: filtering and group-relative advantages.

- Rollouts that did not end `ok` (an infrastructure fault, a timeout) are left out: they have no reward, and
  never get one.
- A group with fewer than two graded rollouts, or (when configured) with zero reward variance, or whose rollouts
  were cut by the length limit (when configured) trains nothing; each case is counted.
- Advantage: `(r - mean) / (std + eps)` over the group's graded rollouts (TRL's trainer uses it as given). The
  reward is the rollout's tree's: every chain of it (forks, sub-agents, compaction's resumed chains) carries the
  rollout's advantage times its kind's weight (`chain_weights`); a kind weighted 0 is left out. By default
  auxiliary side calls (titles) and compaction summaries are out and every other kind is in at 1.
- A sample's tokens are trained once in the rollout (the gate's train-once rule), so a sample whose sampled tokens
  were all trained elsewhere is left out, and its staleness is that of the turns it trains.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from interceptor.store.records import CHAIN_KINDS, RolloutRecord, SampleRecord

__all__ = ["DEFAULT_CHAIN_WEIGHTS", "GroupFilter", "GroupOutcome", "build_group", "trained_turns"]

DEFAULT_CHAIN_WEIGHTS = MappingProxyType(
    {"main": 1.0, "fork": 1.0, "subagent": 1.0, "compaction": 1.0, "summary": 0.0, "auxiliary": 0.0})


@dataclass(frozen=True, kw_only=True)
class GroupFilter:
    drop_zero_variance: bool = True
    drop_truncated: bool = False  # leave out rollouts with a turn cut by the length limit
    # each chain kind's share of its rollout's advantage; kinds not named keep their default
    chain_weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_CHAIN_WEIGHTS)
    eps: float = 1e-6
    min_graded: int = 2

    def __post_init__(self) -> None:
        unknown = set(self.chain_weights) - set(CHAIN_KINDS)
        if unknown:
            raise ValueError(f"chain_weights: unknown kinds {sorted(unknown)}; the kinds are {list(CHAIN_KINDS)}")
        for kind, weight in self.chain_weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                    or weight < 0:
                raise ValueError(f"chain_weights.{kind} must be a finite number >= 0, not {weight!r}")
        object.__setattr__(self, "chain_weights", MappingProxyType({**DEFAULT_CHAIN_WEIGHTS, **self.chain_weights}))


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
            weight = rules.chain_weights[sample.kind]
            if weight == 0 or not any(sample.completion_mask):
                continue
            outcome.samples.append(
                RolloutSample(
                    prompt=[],
                    completion=[],
                    input_ids=np.asarray(sample.input_ids, dtype=np.int64),
                    completion_mask=np.asarray(sample.completion_mask, dtype=np.int64),
                    old_log_probs=np.asarray(sample.old_logprobs, dtype=np.float32),
                    advantage=float(advantage * weight),
                    # The oldest policy that generated any of the tokens it trains (the gate stamps each turn); the
                    # dispatch version when a sample has none recorded.
                    model_version=min((t.policy_version for t in trained_turns(sample)), default=model_version),
                    group_id=group_id,
                    metrics={"reward": float(record.reward), "forks": float(record.forks)},
                    enqueued_at=now,
                )
            )
    return outcome


def trained_turns(sample: SampleRecord) -> list:
    """The turns of `sample` with a sampled token trained here (mask 1): not those it only carries as context."""
    mask = sample.completion_mask
    return [t for t in sample.turns if any(mask[t.completion_start: t.completion_end])]
