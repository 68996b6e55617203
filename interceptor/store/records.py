"""What a rollout leaves behind: the records written to disk and read back, each type defined once.

A `Generation` is what the policy sampled for one turn, as the upstream returned it (validated there).
A `SampleRecord` is one linear token sequence the policy conditioned on: `input_ids`, `completion_mask` (1 where
the policy sampled the token), `old_logprobs` (vLLM's logprob of each sampled token, 0.0 where the mask is 0),
and the turns that built it. A `RolloutRecord` holds one rollout's samples (one per branch of the conversation:
forks start new samples), its message trace, usage, status and failure cause. Each sample is a chain of the
rollout's tree (`ChainRecord`: main, a fork of it, a sub-agent, a compaction's resumed chain, a summary, an
auxiliary side call), and every sampled token has mask 1 in exactly one sample (`store/train_once.py` audits it).

Serialised as JSON Lines with orjson, one rollout per line, tagged with `SCHEMA`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import orjson

__all__ = [
    "CHAIN_KINDS",
    "CHAIN_LINKS",
    "SCHEMA",
    "ChainRecord",
    "Failure",
    "Generation",
    "RolloutRecord",
    "RolloutStatus",
    "SampleRecord",
    "TurnRecord",
]

SCHEMA = "interceptor.rollout/1"
# interrupted: the server stopped (crash, shutdown) before the rollout finished; its completed turns are kept
RolloutStatus = Literal["running", "ok", "failed", "timeout", "interrupted"]
FINISHED_STATUSES = ("ok", "failed", "timeout", "interrupted")


@dataclass(frozen=True, slots=True)
class Generation:
    """What the policy sampled for one turn: one logprob per sampled token, both checked by the upstream client."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # stop | length
    model: str
    seconds: float
    top_logprobs: list[dict[str, float]] | None = None  # per sampled token, when the agent asked for top_logprobs

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError("a generation needs exactly one logprob per sampled token")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    prompt_start: int  # where this turn's new prompt tokens (mask 0) begin in the sample
    completion_start: int  # where the sampled tokens (mask 1) begin
    completion_end: int  # one past the last sampled token
    finish_reason: str  # stop | length | tool_calls
    malformed_tool_call: bool
    model: str
    policy_version: int  # the version the generation started on (its first tokens are that version's)
    seconds: float  # time spent upstream
    # A weight sync began while it was generated: a paused generation continued on the new weights ("keep"), so
    # its tail may be the next version's. The recorded logprobs are still those each token was sampled with.
    spans_sync: bool = False


# main: the agent's own conversation (the root); fork: the same conversation with a rewritten history or a concurrent
# turn; subagent: a chain started by a tool call of its parent; compaction: the chain resumed from a summary of its
# parent; summary: the request that wrote that summary; auxiliary: a side call (a title), a leaf.
CHAIN_KINDS = ("main", "fork", "subagent", "compaction", "summary", "auxiliary")
# How a chain's parent was found: the tool call whose prompt opens it, the history it shares, the summary it
# resumes from, or (nothing else matching) the chain most recently answered when it began.
CHAIN_LINKS = ("tool_call", "history", "summary", "timing")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainRecord:
    """Where a sample sits in its rollout's tree of chains."""

    kind: str  # one of CHAIN_KINDS
    parent: int | None = None  # the parent chain's sample index; None for the root
    parent_turn: int | None = None  # the parent's turn (an index into its `turns`) this chain hangs from
    linked_by: str | None = None  # one of CHAIN_LINKS; None for the root
    shared: int = 0  # leading token ids equal to the parent's: where its sampled tokens are context here


@dataclass(frozen=True, slots=True, kw_only=True)
class SampleRecord:
    index: int
    input_ids: list[int]
    completion_mask: list[int]
    old_logprobs: list[float]
    turns: list[TurnRecord]
    auxiliary: bool  # a side call (different system prompt or tools, e.g. a title request): not for training
    fork_reason: str | None  # why this sample did not extend an earlier one (None for the first sample)
    # Its place in the rollout's tree; None in records written before chains were recorded. Tokens a turn of this
    # sample sampled that have mask 0 were trained in an earlier sample with the same ids before them (a copied
    # history): each sampled token has mask 1 once in a rollout.
    chain: ChainRecord | None = None

    def __post_init__(self) -> None:
        if not len(self.input_ids) == len(self.completion_mask) == len(self.old_logprobs):
            raise ValueError(f"sample {self.index}: input_ids, completion_mask and old_logprobs differ in length")

    @property
    def completion_tokens(self) -> int:
        return sum(self.completion_mask)

    @property
    def kind(self) -> str:
        """The chain's kind; for records without chains, "auxiliary" or "main"/"fork" by position."""
        if self.chain is not None:
            return self.chain.kind
        return "auxiliary" if self.auxiliary else ("main" if self.fork_reason is None else "fork")


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    cause: str  # upstream | agent | sandbox | timeout | grader | ...: an infrastructure fault, never a reward
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutRecord:
    rollout_id: str
    mode: str
    status: RolloutStatus
    samples: list[SampleRecord]
    trace: list[dict]  # per chat call: the messages new to it, and the assistant message returned
    usage: dict[str, int]
    answer: object = None  # what the agent submitted to the `answer` tool (graded on the host)
    reward: float | None = None  # the host grader's; None when not graded (and always when the rollout failed)
    failure: Failure | None = None
    events: list[dict] = field(default_factory=list)  # context overflows, upstream errors, retries answered
    metadata: dict = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float | None = None
    schema: str = SCHEMA

    @property
    def forks(self) -> int:
        """Samples that rewrote a conversation: forks and compaction's resumed chains (the main chain, sub-agents and
        side calls such as a title request are not)."""
        return sum(s.kind in ("fork", "compaction") for s in self.samples)

    def to_json_dict(self) -> dict:
        return orjson.loads(self.to_json())

    def to_json(self) -> bytes:
        """The record as one JSON object. orjson serialises the dataclasses itself, in C: `dataclasses.asdict`
        deep-copied every token id and took a third of a busy server's time."""
        return orjson.dumps(self)

    @classmethod
    def from_json_dict(cls, data: dict) -> RolloutRecord:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"unknown record schema {data.get('schema')!r}; this reader knows {SCHEMA!r}")
        samples = [
            SampleRecord(**{**s, "turns": [TurnRecord(**t) for t in s["turns"]],
                            "chain": ChainRecord(**s["chain"]) if s.get("chain") else None})
            for s in data["samples"]
        ]
        failure = Failure(**data["failure"]) if data.get("failure") else None
        return cls(**{**data, "samples": samples, "failure": failure})
