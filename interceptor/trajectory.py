"""Token-exact trajectory assembly: match each chat request against what was recorded, extend or fork.

A rollout's trajectory is a set of branches; each branch becomes one training sample. For every request:

1. **Retry.** If the same request (messages, tools, sampling) was already answered, or is being answered, the
   caller replays that answer; nothing is generated or recorded twice.
2. **Extend.** If the messages start with exactly the conversation a branch recorded (the assistant messages being
   the ones this server returned) and continue with non-assistant messages only, the prompt is that branch's
   recorded ids plus the rendered suffix: the template's separator, the new messages, the generation prompt. A
   turn cut by `length` gets its end-of-turn token first (mask 0), as the template would close it.
3. **Fork.** Otherwise (compaction, edited history, another system prompt or tool list, a title request, a
   branch already busy with a concurrent turn) a new branch starts from a full render.

Sampled ids are appended with mask 1 and the upstream's logprobs; everything else has mask 0 and logprob 0.0. So
every sample is a sequence the policy actually conditioned on, never a splice. Token storage is compact (`array`
and `bytearray`: 9 bytes per token) because idle rollouts hold it in memory until they finish.

All methods are synchronous: on one event loop, `plan` and `commit` never interleave.
"""

from __future__ import annotations

import functools
import json
from array import array
from dataclasses import dataclass, field

import numpy as np
import orjson

from .records import SampleRecord, TurnRecord
from .rendering import Renderer

__all__ = ["Generation", "TurnPlan", "Trajectory", "message_key", "tools_key"]


@dataclass(frozen=True, slots=True)
class Generation:
    """What the policy sampled for one turn, as the upstream returned it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # stop | length
    model: str
    seconds: float

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError("a generation needs exactly one logprob per sampled token")


@dataclass(slots=True)
class _Branch:
    messages: list[dict]  # the conversation this branch covers, through its last assistant turn
    system: dict | None
    tools_key: bytes
    fork_reason: str | None
    ids: array = field(default_factory=lambda: array("i"))
    mask: bytearray = field(default_factory=bytearray)
    logprobs: array = field(default_factory=lambda: array("f"))
    turns: list[TurnRecord] = field(default_factory=list)
    open_turn: bool = False  # the last turn ended without an end-of-turn token (cut by length)
    busy: bool = False

    def copy(self, reason: str) -> _Branch:
        return _Branch(
            messages=list(self.messages),
            system=self.system,
            tools_key=self.tools_key,
            fork_reason=reason,
            ids=array("i", self.ids),
            mask=bytearray(self.mask),
            logprobs=array("f", self.logprobs),
            turns=list(self.turns),
            open_turn=self.open_turn,
        )


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """A reserved turn: the full prompt to send upstream and where its result goes."""

    branch: _Branch
    prompt_ids: np.ndarray  # int32: the whole sequence the policy will condition on (orjson serialises it in C)
    new_prompt_ids: list[int]  # the part of it not yet recorded (mask 0)
    request_messages: list[dict]
    forked: bool


def message_key(message: dict) -> tuple:
    """What must be equal for two (normalised) messages to be the same turn of a conversation.

    Assistant messages compare by content and tool calls (arguments as parsed JSON, since agents re-serialise
    them); reasoning is left out: agents echo it back or drop it, and the recorded ids keep what was sampled.
    """
    role = message["role"]
    if role == "assistant":
        calls = tuple(
            (c["function"]["name"], _canonical_arguments(c["function"]["arguments"]))
            for c in message.get("tool_calls") or ()
        )
        return ("assistant", (message.get("content") or "").strip(), calls)
    return (role, message.get("content", ""), message.get("tool_call_id"))


def _same_history(recorded: list[dict], incoming: list[dict]) -> bool:
    """Whether `incoming` starts with the `recorded` conversation. Equal dicts compare in C; only messages that
    differ as dicts (the agent's echo of an assistant turn this server returned) are compared by `message_key`."""
    n = len(recorded)
    if incoming[:n] == recorded:
        return True
    return all(a == b or message_key(a) == message_key(b) for a, b in zip(recorded, incoming[:n]))


@functools.lru_cache(maxsize=4096)
def _canonical_arguments(arguments: str) -> str:
    try:
        return orjson.dumps(json.loads(arguments), option=orjson.OPT_SORT_KEYS).decode()
    except (ValueError, TypeError):
        return arguments


def tools_key(tools: list[dict] | None) -> bytes:
    return orjson.dumps(tools, option=orjson.OPT_SORT_KEYS) if tools else b""


class Trajectory:
    def __init__(self, renderer: Renderer, *, stop_ids: frozenset[int]) -> None:
        self._renderer = renderer
        self._stop_ids = stop_ids
        self._branches: list[_Branch] = []

    @property
    def forks(self) -> int:
        return max(0, sum(1 for b in self._branches if b.turns) - 1)

    def plan(self, messages: list[dict], tools: list[dict] | None) -> TurnPlan:
        """Reserve the next turn for these messages: extend the branch they continue, or fork."""
        tkey = tools_key(tools)
        system = messages[0] if messages[0]["role"] == "system" else None
        reason = None
        for branch in reversed(self._branches):
            n = len(branch.messages)
            if not branch.turns or branch.tools_key != tkey or len(messages) <= n:
                continue
            if not _same_history(branch.messages, messages):
                continue
            if any(m["role"] == "assistant" for m in messages[n:]):
                reason = "the new messages hold an assistant turn this server did not generate"
                continue
            suffix = self._renderer.render_suffix(
                system=system,
                last_assistant=messages[n - 1],
                new_messages=messages[n:],
                tools=tools,
            )
            if suffix is None:
                reason = "the chat template closes no turn after the assistant message"
                break
            if branch.open_turn:
                suffix = [self._renderer.end_of_turn_id, *suffix]
            forked = branch.busy
            if forked:  # a concurrent turn on the same history: both are real, keep both
                branch = branch.copy("concurrent turn on the same history")
                self._branches.append(branch)
            branch.busy = True
            return TurnPlan(
                branch=branch,
                prompt_ids=np.concatenate([np.frombuffer(branch.ids, dtype=np.int32), np.asarray(suffix, np.int32)]),
                new_prompt_ids=suffix,
                request_messages=messages,
                forked=forked,
            )
        prompt = self._renderer.render_full(messages, tools)
        branch = _Branch(
            messages=[],
            system=system,
            tools_key=tkey,
            fork_reason=(reason or self._why_not_extended(messages, tkey)) if self._branches else None,
        )
        branch.busy = True
        self._branches.append(branch)
        return TurnPlan(
            branch=branch,
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            new_prompt_ids=prompt,
            request_messages=messages,
            forked=True,
        )

    def _why_not_extended(self, messages: list[dict], tkey: bytes) -> str:
        latest = next((b for b in reversed(self._branches) if b.turns), None)
        if latest is None:
            return "no earlier sample has a finished turn yet"
        if latest.tools_key != tkey:
            return "the tool list differs from the latest sample's"
        for i, (old, new) in enumerate(zip(latest.messages, messages)):
            if old != new and message_key(old) != message_key(new):
                if old["role"] == "assistant":
                    return f"message {i} is not the assistant turn this server returned"
                return f"message {i} ({new['role']}) differs from the recorded history"
        return "the history is shorter than the latest sample's"

    def commit(self, plan: TurnPlan, generation: Generation, *, returned: dict, finish_reason: str,
               malformed: bool, policy_version: int) -> None:
        """Record a generated turn: the new prompt ids (mask 0), then the sampled ids (mask 1, with logprobs)."""
        branch = plan.branch
        prompt_start = len(branch.ids)
        branch.ids.extend(plan.new_prompt_ids)
        branch.mask.extend(bytes(len(plan.new_prompt_ids)))
        branch.logprobs.extend(array("f", bytes(4 * len(plan.new_prompt_ids))))
        completion_start = len(branch.ids)
        branch.ids.extend(generation.token_ids)
        branch.mask.extend(b"\x01" * len(generation.token_ids))
        branch.logprobs.extend(generation.logprobs)
        branch.turns.append(
            TurnRecord(
                prompt_start=prompt_start,
                completion_start=completion_start,
                completion_end=len(branch.ids),
                finish_reason=finish_reason,
                malformed_tool_call=malformed,
                model=generation.model,
                policy_version=policy_version,
                seconds=round(generation.seconds, 6),
            )
        )
        # Keep the agent's own copies: next turn it sends the same dicts again, which compare at C speed.
        branch.messages = [*plan.request_messages, returned]
        branch.open_turn = not generation.token_ids or generation.token_ids[-1] not in self._stop_ids
        branch.busy = False

    def release(self, plan: TurnPlan) -> None:
        """Give back a turn that produced nothing (upstream failure, overflow): the branch stays as it was."""
        plan.branch.busy = False
        if not plan.branch.turns:
            self._branches.remove(plan.branch)  # a fork that never got a turn leaves no sample

    def samples(self) -> list[SampleRecord]:
        branches = [b for b in self._branches if b.turns]
        primary = next((b for b in branches if b.tools_key), branches[0] if branches else None)
        return [
            SampleRecord(
                index=i,
                input_ids=b.ids.tolist(),
                completion_mask=list(b.mask),
                old_logprobs=b.logprobs.tolist(),
                turns=list(b.turns),
                auxiliary=primary is not None
                and (b.tools_key != primary.tools_key or b.system != primary.system),
                fork_reason=b.fork_reason,
            )
            for i, b in enumerate(branches)
        ]

    def recorded_tokens(self) -> int:
        return sum(len(b.ids) for b in self._branches)
