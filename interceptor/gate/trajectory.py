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
every sample is a sequence the policy actually conditioned on, never a splice. Token storage is compact
(`branch_record.py`: each id once, as JSON text the upstream request is built from; logprobs of sampled ids only)
because idle rollouts hold it in memory until they finish.

All methods are synchronous: on one event loop, `plan` and `commit` never interleave.
"""

from __future__ import annotations

import dataclasses
import hashlib
from array import array
from dataclasses import dataclass, field

import orjson

from interceptor.errors import BadRequest
from interceptor.gate.branch_record import BranchRecord, Lineage, build_samples
from interceptor.gate.history import message_key, same_history
from interceptor.gate.lineage import place
from interceptor.store.records import Generation, SampleRecord, TurnRecord
from interceptor.tokens.ids_json import IdsJson, PromptJson
from interceptor.tokens.rendering import Renderer
from interceptor.wire.protocol import normalize_messages, tools_key

__all__ = ["BranchRecord", "TurnPlan", "Trajectory", "build_samples", "message_key", "tools_key"]

_TURN_FIELDS = tuple(f.name for f in dataclasses.fields(TurnRecord))


@dataclass(eq=False)
class _Branch(BranchRecord):
    # The conversation covered: the messages of its last turn's request (the caller's list, kept as it is: never
    # changed, by anyone) and the assistant message this server answered them with.
    asked: list[dict] = field(default_factory=list)
    answer: dict | None = None
    system: dict | None = None
    tools_key: bytes = b""
    origin: tuple[int, int] | None = None  # (branch number, length) this branch was copied from
    open_turn: bool = False  # the last turn ended without an end-of-turn token (cut by length)
    busy: bool = False
    journaled: bool = False  # its first commit (which says where it came from) has been handed out
    closing: tuple[dict, int] | None = None  # its last message, normalised, and `Renderer.closing_turns` of it
    calls: list[tuple[int, dict]] = field(default_factory=list)  # (turn, a tool call returned on it): `lineage.py`
    claimed: set = field(default_factory=set)  # ids of those calls that opened a chain
    claim: tuple[_Branch, str] | None = None  # the parent and the id of the tool call that opened this chain
    marked_subagent: bool = False  # started by a request the agent marked a sub-agent's (`request_kind`)

    @property
    def covered(self) -> int:
        """How many messages the branch covers (0 before its first turn)."""
        return len(self.asked) + 1 if self.answer is not None else 0

    @property
    def messages(self) -> list[dict]:
        """The conversation covered, through its last assistant turn."""
        return [*self.asked, self.answer] if self.answer is not None else []

    def continued_by(self, messages: list[dict], carried: tuple[list[dict] | None, int]) -> bool:
        """Whether `messages` start with the conversation this branch covers. When they carry the very objects of
        its last request (`ChatRequest.carried` names the list it holds, `asked`), only its answer is compared:
        O(1) in the history."""
        asked = self.asked
        if carried[0] is not asked or carried[1] < len(asked):
            return same_history(self.messages, messages)
        echo, answer = messages[len(asked)], self.answer
        return echo == answer or message_key(echo) == message_key(answer)

    def copy(self, number: int, reason: str) -> _Branch:
        return _Branch(
            number=number,
            tools_digest=self.tools_digest,
            system_digest=self.system_digest,
            fork_reason=reason,
            lineage=Lineage("fork", self.number, len(self.turns) - 1, "history"),
            parts=list(self.parts),
            length=self.length,
            sampled_logprobs=array("f", self.sampled_logprobs),
            turns=list(self.turns),
            asked=self.asked,
            answer=self.answer,
            system=self.system,
            tools_key=self.tools_key,
            origin=(self.number, self.length),
            open_turn=self.open_turn,
            closing=self.closing,
            marked_subagent=self.marked_subagent,
        )


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest() if data else ""


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """A reserved turn: the full prompt to send upstream and where its result goes."""

    branch: _Branch
    prompt: PromptJson  # the whole sequence the policy will condition on (its ids as JSON, joined when sent)
    request_messages: list[dict]
    forked: bool
    # The chain this turn is on, for the rollout's failure accounting: the branch it extends (or copies), or for a
    # new chain its place in the tree, which the agent's retry of a failed first turn gets again.
    chain: tuple = ()

    @property
    def prompt_len(self) -> int:
        return self.prompt.count

    @property
    def new_prompt(self) -> IdsJson:
        """The part of the prompt not yet recorded (mask 0)."""
        return self.prompt.new

    @property
    def prompt_ids(self) -> list[int]:
        return orjson.loads(self.prompt.json)


class Trajectory:
    def __init__(self, renderer: Renderer, *, stop_ids: frozenset[int]) -> None:
        self._renderer = renderer
        self._stop_ids = stop_ids
        self._branches: list[_Branch] = []
        self._created = 0  # branches numbered in creation order (the journal names them by number)

    def _number(self) -> int:
        self._created += 1
        return self._created

    def plan(self, messages: list[dict], tools: list[dict] | None, tkey: bytes | None = None,
             carried: tuple[list[dict] | None, int] = (None, 0), request_kind: str | None = None) -> TurnPlan:
        """Reserve the next turn for these messages: extend the branch they continue, or fork. `tkey` is
        `tools_key(tools)` when the caller has it already; `carried` is `ChatRequest.carried`. The trajectory
        keeps `messages` as they are: the caller does not change the list afterwards."""
        tkey = tools_key(tools) if tkey is None else tkey
        plan, reason = self.extend(messages, tools, tkey, carried, request_kind)
        if plan is not None:
            return plan
        return self.fork(messages, tkey, self._renderer.render_full_json(messages, tools), reason=reason,
                         request_kind=request_kind)

    def extend(self, messages: list[dict], tools: list[dict] | None, tkey: bytes,
               carried: tuple[list[dict] | None, int] = (None, 0),
               request_kind: str | None = None) -> tuple[TurnPlan | None, str | None]:
        """Reserve the next turn on the branch these messages continue (rendering only the new messages), or
        (None, why not) when none does: then the caller renders the whole conversation and calls `fork`. A request
        the agent marked a sub-agent's extends only a chain such requests started (a sub-agent spawned with its
        parent's history would otherwise continue its parent's chain)."""
        system = messages[0] if messages[0]["role"] == "system" else None
        reason = None
        marked = request_kind == "subagent"
        for branch in reversed(self._branches):
            n = branch.covered
            if not branch.turns or branch.tools_key != tkey or len(messages) <= n or marked > branch.marked_subagent:
                continue
            if not branch.continued_by(messages, carried):
                continue
            if any(m["role"] == "assistant" for m in messages[n:]):
                reason = "the new messages hold an assistant turn this server did not generate"
                continue
            last = messages[n - 1]
            closing = branch.closing
            suffix = self._renderer.render_suffix(
                system=system,
                last_assistant=last,
                new_messages=messages[n:],
                tools=tools,
                # worked out for the message this server returned; the agent's copy is usually equal to it
                closing_turns=closing[1] if closing is not None and closing[0] == last else None,
            )
            if suffix is None:
                reason = "the chat template closes no turn after the assistant message"
                break
            if branch.open_turn:
                suffix = [self._renderer.end_of_turn_id, *suffix]
            forked, chain = branch.busy, ("branch", branch.number)
            if forked:  # a concurrent turn on the same history: both are real, keep both
                branch = branch.copy(self._number(), "concurrent turn on the same history")
                self._branches.append(branch)
            branch.busy = True
            new = IdsJson.of(suffix)
            return TurnPlan(
                branch=branch,
                prompt=branch.prompt(new),
                request_messages=messages,
                forked=forked,
                chain=chain,
            ), None
        return None, reason

    def fork(self, messages: list[dict], tkey: bytes, prompt: IdsJson, *, reason: str | None,
             request_kind: str | None = None) -> TurnPlan:
        """Reserve the next turn on a new branch whose prompt is `prompt`, the full render of `messages`, placed in
        the rollout's tree (`lineage.place`; `request_kind` is the dialect's word for it)."""
        system = messages[0] if messages[0]["role"] == "system" else None
        lineage, call_id = place(self._branches, messages, tkey, request_kind)
        branch = _Branch(
            marked_subagent=request_kind == "subagent",
            number=self._number(),
            tools_digest=_digest(tkey),
            system_digest=_digest(orjson.dumps(system)) if system else "",
            fork_reason=(reason or self._why_not_extended(messages, tkey)) if self._branches else None,
            lineage=lineage,
            system=system,
            tools_key=tkey,
        )
        if call_id is not None:
            parent = next(b for b in self._branches if b.number == lineage.parent)
            parent.claimed.add(call_id)
            branch.claim = (parent, call_id)
        branch.busy = True
        self._branches.append(branch)
        return TurnPlan(
            branch=branch,
            prompt=PromptJson.fresh(prompt),
            request_messages=messages,
            forked=True,
            chain=("new", *lineage.to_list()),
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
               malformed: bool, policy_version: int, spans_sync: bool) -> dict:
        """Record a generated turn: the new prompt ids (mask 0), then the sampled ids (mask 1, with logprobs).
        Returns what the journal needs to rebuild the branch (its first turn also says where it came from)."""
        branch = plan.branch
        first, branch.journaled = not branch.journaled, True
        turn = branch.append_turn(plan.new_prompt, generation.token_ids, generation.logprobs, {
            "finish_reason": finish_reason, "malformed_tool_call": malformed, "model": generation.model,
            "policy_version": policy_version, "spans_sync": spans_sync, "seconds": round(generation.seconds, 6),
        })
        # The agent's own list, not a copy: its next request carries the same objects (`ChatRequest.carried`).
        branch.asked, branch.answer = plan.request_messages, returned
        branch.calls.extend((len(branch.turns) - 1, call) for call in returned.get("tool_calls") or ())
        branch.open_turn = not generation.token_ids or generation.token_ids[-1] not in self._stop_ids
        branch.busy = False
        delta = {"b": branch.number, "p": orjson.Fragment(plan.new_prompt.json), "t": generation.token_ids,
                 "l": generation.logprobs, "turn": {name: getattr(turn, name) for name in _TURN_FIELDS}}
        if first:
            delta.update(o=branch.origin, fr=branch.fork_reason, tk=branch.tools_digest, sk=branch.system_digest,
                         ln=branch.lineage.to_list() if branch.lineage is not None else None)
        return delta

    def prepare_next(self, branch: _Branch, tools: list[dict] | None) -> None:
        """What the next turn on `branch` renders whatever its new messages are, worked out now (the gate calls
        this once a turn's answer is out, while the agent runs its tools): how many end-of-turn tokens the template
        renders through the branch's last assistant message. The next `extend` uses it when the agent sends that
        message back unchanged; otherwise it renders it itself, as without this. `tools`: those of the turn just
        committed on it (the branch's tools)."""
        if branch.busy or branch.answer is None or self._renderer.writes_suffixes:
            return  # a turn on it already started, or the suffix is written without the template (no count needed)
        try:  # as the agent's copy will read once normalised (an answer's `"content": null` comes back as "")
            last = normalize_messages([branch.answer])[0]
            turns = self._renderer.closing_turns(system=branch.system, last_assistant=last, tools=tools)
        except BadRequest:
            return  # the template rejects it: the next turn's own render says so to its client
        branch.closing = (last, turns)

    def release(self, plan: TurnPlan) -> None:
        """Give back a turn that produced nothing (upstream failure, overflow): the branch stays as it was."""
        plan.branch.busy = False
        if not plan.branch.turns:
            self._branches.remove(plan.branch)  # a fork that never got a turn leaves no sample
            if plan.branch.claim is not None:  # nor keeps the tool call that opened it: a retry finds it again
                parent, call_id = plan.branch.claim
                parent.claimed.discard(call_id)

    def samples(self) -> list[SampleRecord]:
        return build_samples(self._branches)

    def recorded_tokens(self) -> int:
        return sum(b.length for b in self._branches)
