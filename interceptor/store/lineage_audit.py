"""The audit of a rollout's samples at finish: one tree of chains, and every sampled token trained exactly once.

It reads the samples as they will be written, by token position and content, and trusts nothing the gate kept:

- **The tree.** Every sample has a chain; exactly one is the root (kind main, no parent), every other names an
  existing parent, following parents reaches the root, and a parent turn is one of the parent's turns.
- **The mask.** Mask 1 only inside a turn's sampled span, logprob 0.0 wherever the mask is 0.
- **Train once.** No position is trained (mask 1) in two samples whose ids are equal through that position: the
  samples are sorted by their ids, so those sharing a prefix are neighbours, and one sweep keeps, per position,
  whether a sample of the current run of neighbours has trained it.

A rollout whose samples fail it is recorded `failed` with cause `lineage` and no reward (`rollouts.py`): a record
that would train a token twice must never reach a trainer.
"""

from __future__ import annotations

import numpy as np

from interceptor.store.records import CHAIN_KINDS, CHAIN_LINKS, SampleRecord

__all__ = ["audit_lineage", "common_prefix"]

_SHOWN = 3  # problems named in the message


def audit_lineage(samples: list[SampleRecord]) -> list[str]:
    """What is wrong with these samples (empty when nothing is)."""
    if not samples:
        return []
    problems = _tree(samples) + [p for s in samples for p in _mask(s)]
    return problems + _trained_twice(samples)


def _tree(samples: list[SampleRecord]) -> list[str]:
    problems, roots = [], []
    for s in samples:
        chain = s.chain
        if chain is None:
            problems.append(f"sample {s.index} has no chain")
            continue
        if chain.kind not in CHAIN_KINDS:
            problems.append(f"sample {s.index}: unknown chain kind {chain.kind!r}")
        if chain.parent is None:
            roots.append(s.index)
            continue
        if not 0 <= chain.parent < len(samples) or chain.parent == s.index:
            problems.append(f"sample {s.index}: parent {chain.parent} is not another sample")
            continue
        if chain.linked_by not in CHAIN_LINKS:
            problems.append(f"sample {s.index}: unknown link {chain.linked_by!r}")
        turns = len(samples[chain.parent].turns)
        if chain.parent_turn is not None and not 0 <= chain.parent_turn < turns:
            problems.append(f"sample {s.index}: parent turn {chain.parent_turn} of a sample with {turns} turns")
    if problems:
        return problems
    if len(roots) != 1 or samples[roots[0]].chain.kind != "main":
        return [f"the tree needs one root of kind main; roots: {roots}"]
    for s in samples:  # every chain reaches the root
        seen, at = set(), s.index
        while samples[at].chain.parent is not None:
            if at in seen:
                return [f"sample {s.index}: its parents form a cycle"]
            seen.add(at)
            at = samples[at].chain.parent
    return []


def _mask(sample: SampleRecord) -> list[str]:
    mask = np.asarray(sample.completion_mask, dtype=np.int64)
    sampled = np.zeros(len(mask), dtype=bool)
    for turn in sample.turns:
        sampled[turn.completion_start: turn.completion_end] = True
    if ((mask != 0) & (mask != 1)).any():
        return [f"sample {sample.index}: the mask holds values other than 0 and 1"]
    outside = np.flatnonzero((mask == 1) & ~sampled)
    if len(outside):
        return [f"sample {sample.index}: position {int(outside[0])} has mask 1 outside a sampled span"]
    logprobs = np.asarray(sample.old_logprobs, dtype=np.float64)
    stray = np.flatnonzero((mask == 0) & (logprobs != 0.0))
    if len(stray):
        return [f"sample {sample.index}: position {int(stray[0])} has mask 0 and a logprob"]
    return []


def _trained_twice(samples: list[SampleRecord]) -> list[str]:
    order = sorted(range(len(samples)), key=lambda i: samples[i].input_ids)
    longest = max(len(s.input_ids) for s in samples)
    trainer = np.full(longest, -1, dtype=np.int64)  # per position: the sample of the current run that trained it
    problems, previous = [], None
    for i in order:
        ids = np.asarray(samples[i].input_ids, dtype=np.int64)
        mask = np.asarray(samples[i].completion_mask, dtype=np.int64) == 1
        shared = 0 if previous is None else common_prefix(previous, ids)
        trainer[shared:] = -1  # positions past the shared prefix start a new run
        twice = np.flatnonzero(mask & (trainer[: len(ids)] >= 0))
        for position in twice[:_SHOWN].tolist():
            pair = sorted((int(trainer[position]), i))
            problems.append(f"token {position} (id {int(ids[position])}) is trained in samples {pair[0]} and {pair[1]}")
        trainer[: len(ids)][mask] = i
        previous = ids
    return problems


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids `a` and `b` share: compared in growing blocks, so unrelated chains cost little."""
    n, start, block = min(len(a), len(b)), 0, 64
    while start < n:
        end = min(n, start + block)
        differ = np.flatnonzero(a[start:end] != b[start:end])
        if len(differ):
            return start + int(differ[0])
        start, block = end, block * 4
    return n
