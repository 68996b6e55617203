"""One branch's recorded tokens, held compactly while its rollout lives: what becomes a `SampleRecord`.

Idle rollouts hold their branches in memory until they finish, so each token is stored once, as JSON text: one
part per turn (`parts`: b"1,2,3" for the first turn, b",4,5" for each one after), never changed once written, so
recording a turn copies only its own ids, a turn's prompt refers to the parts instead of copying them
(`ids_json.PromptJson`), and a fork shares its parent's parts. The upstream body is joined from them where it is
made, once. The mask is not stored: it is 1 exactly on each turn's sampled span. Logprobs are stored for sampled
tokens only (everything else has logprob 0.0). `build_samples` expands all three into full-length lists when the
rollout is recorded. Live branches (`trajectory.py`) and branches rebuilt from the journal (`journal.py`) are both
this.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import orjson

from interceptor.store.records import SampleRecord, TurnRecord
from interceptor.tokens.ids_json import IdsJson, PromptJson

__all__ = ["BranchRecord", "build_samples", "json_ids"]


def json_ids(ids: list[int]) -> bytes:
    """Ids as the inside of a JSON array: b"1,2,3"."""
    return orjson.dumps(ids)[1:-1]


@dataclass(eq=False)
class BranchRecord:
    number: int  # order of creation within the rollout
    tools_digest: str  # "" when the branch's requests carry no tools
    system_digest: str  # "" when they have no system message
    fork_reason: str | None
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

    def copy_through(self, length: int, *, number: int, fork_reason: str | None) -> BranchRecord:
        """A new branch holding this one's first `length` ids, which end a turn (where a fork copied it)."""
        kept = [t for t in self.turns if t.completion_end <= length]
        if (kept[-1].completion_end if kept else 0) != length:
            raise ValueError(f"branch {self.number}: {length} does not end a turn")
        sampled = sum(t.completion_end - t.completion_start for t in kept)
        return BranchRecord(
            number=number, tools_digest=self.tools_digest, system_digest=self.system_digest, fork_reason=fork_reason,
            parts=self.parts[: len(kept)], length=length,
            sampled_logprobs=array("f", self.sampled_logprobs[:sampled]), turns=kept,
        )

    def ids(self) -> list[int]:
        return orjson.loads(b"".join([b"[", *self.parts, b"]"]))  # one copy of the parts, then parsed


def build_samples(branches: list[BranchRecord]) -> list[SampleRecord]:
    """Samples of the branches that have turns, in creation order. A branch whose tools or system prompt differ
    from the main one's (the first with tools) is auxiliary: a side call such as a title request."""
    branches = [b for b in branches if b.turns]
    primary = next((b for b in branches if b.tools_digest), branches[0] if branches else None)
    return [
        SampleRecord(
            index=i,
            input_ids=b.ids(),
            completion_mask=mask,
            old_logprobs=logprobs,
            turns=list(b.turns),
            auxiliary=primary is not None
            and (b.tools_digest != primary.tools_digest or b.system_digest != primary.system_digest),
            fork_reason=b.fork_reason,
        )
        for i, b in enumerate(branches)
        for mask, logprobs in [_expanded(b)]
    ]


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
