"""One branch's recorded tokens, held compactly while its rollout lives: what becomes a `SampleRecord`.

Idle rollouts hold their branches in memory until they finish, so each token is stored once, as the text of a
JSON array (`ids_json`, b"1,2,3": what the upstream request is built from, so nothing is serialised per turn). It
is immutable bytes of its exact size, rebuilt once per turn (a copy the request's own join makes anyway): a
growing bytearray would hold up to an eighth more than its length, and a fork shares its parent's bytes.
The mask is not stored: it is 1 exactly on each turn's sampled span. Logprobs are stored for sampled tokens only
(everything else has logprob 0.0). `build_samples` expands all three into full-length lists when the rollout is
recorded. Live branches (`trajectory.py`) and branches rebuilt from the journal (`journal.py`) are both this.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import orjson

from .ids_json import IdsJson
from .records import SampleRecord, TurnRecord

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
    ids_json: bytes = b""  # every id, as the inside of a JSON array
    length: int = 0  # ids recorded
    sampled_logprobs: array = field(default_factory=lambda: array("f"))  # one per sampled id, in order
    turns: list[TurnRecord] = field(default_factory=list)
    turn_json_ends: list[int] = field(default_factory=list)  # len(ids_json) after each turn

    def prompt_json(self, suffix: IdsJson) -> bytes:
        """The JSON array of the recorded ids followed by `suffix`."""
        tail = suffix.inner()
        comma = b"," if self.ids_json and tail else b""
        return b"".join((b"[", self.ids_json, comma, tail, b"]"))

    def append_turn(self, prompt: IdsJson, sampled: list[int], logprobs: list[float], turn_fields: dict) -> TurnRecord:
        """Record a turn: `prompt` (mask 0) then `sampled` (mask 1, with `logprobs`). `turn_fields` are the
        `TurnRecord`'s other fields; its positions are filled in here."""
        prompt_start = self.length
        completion_start = prompt_start + prompt.count
        self.ids_json = b",".join([part for part in (self.ids_json, prompt.inner(), json_ids(sampled)) if part])
        self.length = completion_start + len(sampled)
        self.sampled_logprobs.extend(logprobs)
        turn = TurnRecord(prompt_start=prompt_start, completion_start=completion_start, completion_end=self.length,
                          **turn_fields)  # fmt: skip
        self.turns.append(turn)
        self.turn_json_ends.append(len(self.ids_json))
        return turn

    def copy_through(self, length: int, *, number: int, fork_reason: str | None) -> BranchRecord:
        """A new branch holding this one's first `length` ids, which end a turn (where a fork copied it)."""
        kept = [t for t in self.turns if t.completion_end <= length]
        if (kept[-1].completion_end if kept else 0) != length:
            raise ValueError(f"branch {self.number}: {length} does not end a turn")
        sampled = sum(t.completion_end - t.completion_start for t in kept)
        json_end = self.turn_json_ends[len(kept) - 1] if kept else 0
        return BranchRecord(
            number=number, tools_digest=self.tools_digest, system_digest=self.system_digest, fork_reason=fork_reason,
            ids_json=self.ids_json[:json_end], length=length,
            sampled_logprobs=array("f", self.sampled_logprobs[:sampled]), turns=kept,
            turn_json_ends=self.turn_json_ends[: len(kept)],
        )

    def ids(self) -> list[int]:
        return orjson.loads(b"[" + self.ids_json + b"]")


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
