"""One branch's recorded tokens, held compactly while its rollout lives: what becomes a `SampleRecord`.

Idle rollouts hold their branches in memory until they finish, so each token is stored once, as JSON text: one
part per turn (`parts`: b"1,2,3" for the first turn, b",4,5" for each one after), never changed once written, so
recording a turn copies only its own ids, a turn's prompt refers to the parts instead of copying them
(`ids_json.PromptJson`), and a fork shares its parent's parts. The upstream body is joined from them where it is
made, once. The mask is not stored: it is 1 exactly on each turn's sampled span. Logprobs are stored for sampled
tokens only (everything else has logprob 0.0). `build_samples` expands all three into full-length lists when the
rollout is recorded. Live branches (`trajectory.py`) and branches rebuilt from the journal (`journal.py`) are both
this.

Each branch is a chain of the rollout's tree (`lineage.py` places it: kind, parent branch and turn). When the
samples are built, a sampled token is trained once: where a sample's ids through a position equal an earlier
sample's and both sampled it (a branch copied for a concurrent turn carries its parent's turns), the later one has
mask 0 there (`train_once`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np
import orjson

from interceptor.store.lineage_audit import common_prefix
from interceptor.store.records import ChainRecord, SampleRecord, TurnRecord
from interceptor.tokens.ids_json import IdsJson, PromptJson

__all__ = ["BranchRecord", "Lineage", "build_samples", "json_ids"]


def json_ids(ids: list[int]) -> bytes:
    """Ids as the inside of a JSON array: b"1,2,3"."""
    return orjson.dumps(ids)[1:-1]


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a branch hangs in the rollout's tree, by branch number (the journal keeps it as a list)."""

    kind: str  # records.CHAIN_KINDS
    parent: int | None = None  # the parent branch's number
    parent_turn: int | None = None
    linked_by: str | None = None  # records.CHAIN_LINKS

    def to_list(self) -> list:
        return [self.kind, self.parent, self.parent_turn, self.linked_by]


@dataclass(eq=False)
class BranchRecord:
    number: int  # order of creation within the rollout
    tools_digest: str  # "" when the branch's requests carry no tools
    system_digest: str  # "" when they have no system message
    fork_reason: str | None
    lineage: Lineage | None = None  # None: placed when the samples are built (records from before lineages)
    parts: list[bytes] = field(default_factory=list)  # each turn's ids, as JSON text: joined, every id
    length: int = 0  # ids recorded
    sampled_logprobs: array = field(default_factory=lambda: array("f"))  # one per sampled id, in order
    turns: list[TurnRecord] = field(default_factory=list)

    def prompt(self, suffix: IdsJson) -> PromptJson:
        """The recorded ids followed by `suffix`, nothing copied."""
        return PromptJson(self.parts, len(self.parts), suffix, self.length + suffix.count)

    def append_turn(self, prompt: IdsJson, sampled: list[int], logprobs: list[float], turn_fields: dict) -> TurnRecord:
        """Record a turn: `prompt` (mask 0) then `sampled` (mask 1, with `logprobs`). `turn_fields` are the
        `TurnRecord`'s other fields; its positions are filled in here."""
        prompt_start = self.length
        completion_start = prompt_start + prompt.count
        ids = b",".join([part for part in (prompt.inner(), json_ids(sampled)) if part])
        self.parts.append(b"," + ids if ids and prompt_start else ids)
        self.length = completion_start + len(sampled)
        self.sampled_logprobs.extend(logprobs)
        turn = TurnRecord(prompt_start=prompt_start, completion_start=completion_start, completion_end=self.length,
                          **turn_fields)  # fmt: skip
        self.turns.append(turn)
        return turn

    def copy_through(self, length: int, *, number: int, fork_reason: str | None,
                     lineage: Lineage | None = None) -> BranchRecord:
        """A new branch holding this one's first `length` ids, which end a turn (where a fork copied it)."""
        kept = [t for t in self.turns if t.completion_end <= length]
        if (kept[-1].completion_end if kept else 0) != length:
            raise ValueError(f"branch {self.number}: {length} does not end a turn")
        sampled = sum(t.completion_end - t.completion_start for t in kept)
        return BranchRecord(
            number=number, tools_digest=self.tools_digest, system_digest=self.system_digest, fork_reason=fork_reason,
            lineage=lineage, parts=self.parts[: len(kept)], length=length,
            sampled_logprobs=array("f", self.sampled_logprobs[:sampled]), turns=kept,
        )

    def ids(self) -> list[int]:
        return orjson.loads(b"".join([b"[", *self.parts, b"]"]))  # one copy of the parts, then parsed


def build_samples(branches: list[BranchRecord]) -> list[SampleRecord]:
    """Samples of the branches that have turns, in creation order, each a chain of the tree: a branch with no
    parent that is not the root hangs from the root (an auxiliary call made before the main one). A sampled token
    has mask 1 in the first sample (in creation order) whose ids through it are the same."""
    branches = [b for b in branches if b.turns]
    if not branches:
        return []
    index = {b.number: i for i, b in enumerate(branches)}
    root = next((b for b in branches if b.lineage is not None and b.lineage.kind == "main"), None)
    root = root or next((b for b in branches if b.tools_digest), branches[0])
    ids = [b.ids() for b in branches]
    arrays = [np.asarray(x, dtype=np.int64) for x in ids]
    expanded = [_expanded(b) for b in branches]
    masks = [np.asarray(mask, dtype=np.int8) for mask, _ in expanded]
    train_once(arrays, masks)
    samples = []
    for i, b in enumerate(branches):
        lineage = b.lineage or _legacy_lineage(b, root)
        parent = index.get(lineage.parent) if lineage.parent is not None else None
        linked_by = lineage.linked_by
        if parent is None and b is not root:
            parent, linked_by = index[root.number], linked_by or "timing"
        mask = masks[i].tolist()
        logprobs = expanded[i][1]
        for position in np.flatnonzero(masks[i] != np.asarray(expanded[i][0], dtype=np.int8)).tolist():
            logprobs[position] = 0.0  # trained in an earlier sample: context here
        kind = "main" if b is root else ("fork" if lineage.kind == "main" else lineage.kind)
        samples.append(SampleRecord(
            index=i, input_ids=ids[i], completion_mask=mask, old_logprobs=logprobs, turns=list(b.turns),
            auxiliary=kind in ("auxiliary", "summary"), fork_reason=b.fork_reason,
            chain=ChainRecord(
                kind=kind, parent=parent, parent_turn=lineage.parent_turn if parent is not None else None,
                linked_by=linked_by if parent is not None else None,
                shared=common_prefix(arrays[i], arrays[parent]) if parent is not None else 0,
            ),
        ))  # fmt: skip
    return samples


def _legacy_lineage(branch: BranchRecord, root: BranchRecord) -> Lineage:
    """A branch journaled before lineages were: auxiliary when its tools or system prompt differ from the root's."""
    if branch is root:
        return Lineage("main")
    side = branch.tools_digest != root.tools_digest or branch.system_digest != root.system_digest
    return Lineage("auxiliary" if side else "fork", root.number, None, "timing")


def train_once(ids: list[np.ndarray], masks: list[np.ndarray]) -> None:
    """Clear, in place, each sample's mask where an earlier sample with the same ids through that position already
    has mask 1 there. Pairs are compared by their common prefix, which is short between different chains."""
    for j in range(1, len(ids)):
        for i in range(j):
            shared = common_prefix(ids[i], ids[j])
            if shared:
                head = masks[j][:shared]
                head[masks[i][:shared] == 1] = 0


def _expanded(branch: BranchRecord) -> tuple[list[int], list[float]]:
    mask, logprobs = [0] * branch.length, [0.0] * branch.length
    sampled = branch.sampled_logprobs.tolist()
    taken = 0
    for turn in branch.turns:
        n = turn.completion_end - turn.completion_start
        mask[turn.completion_start: turn.completion_end] = [1] * n
        logprobs[turn.completion_start: turn.completion_end] = sampled[taken: taken + n]
        taken += n
    return mask, logprobs
