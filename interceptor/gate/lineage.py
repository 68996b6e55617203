"""Where a new chain hangs in its rollout's tree: its kind, its parent branch and turn, and how that was found.

A chain is a branch (`trajectory.py`): requests whose prompts extend each other. A request that extends no branch
starts a new one, placed here from what the agent sent, in this order:

1. **summary**: the dialect marked it a compaction request (`ChatRequest.request_kind`); its parent is the chain
   whose history it carries (the longest shared run of messages), from that chain's latest turn (agents rewrite
   parts of the history they summarise, so the shared run can end earlier).
2. **compaction**: a message carries a summary this server wrote (a line of a summary chain's answer, tags such as
   `<summary>` left out); its parent is the chain that summary summarised.
3. **subagent**, when the dialect says the agent marked it one (Codex's `x-openai-subagent`): under the turn of
   the tool call that opened it (as in 5), else the chain whose history it starts from (a sub-agent spawned with
   its parent's history, `fork_context`).
4. **fork**: same tools, and it shares at least its first message after the system prompt with a chain (a
   rewritten history); its parent is the chain sharing the most, from that chain's last turn inside the shared part.
5. **subagent**: its opening user messages (those before its first assistant turn) carry a string argument of a
   tool call this server returned (Claude Code's `Agent` `prompt`, OpenCode's `task` `prompt`, Codex's `spawn_agent`
   `message`); its parent is the turn of that call. Each call opens one chain; calls of tools named like a sub-agent's are tried first (a namespaced
   function, `multi_agent_v1.spawn_agent`, by its own name).
6. **main**: the first chain with tools.
7. **auxiliary**: no tools (a title request); a leaf under the chain answered most recently.
8. otherwise **subagent** under the chain answered most recently ("timing").

A branch copied for a concurrent turn on the same history is a fork of the branch it copies (`Trajectory.extend`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Protocol

import orjson

from interceptor.gate.branch_record import Lineage
from interceptor.gate.history import message_key

__all__ = ["SUBAGENT_TOOLS", "place"]

# Tools that start a sub-agent in the agents Interceptor runs: their calls are matched first.
SUBAGENT_TOOLS = frozenset({"Task", "Agent", "task", "spawn_agent", "spawn_subagent", "delegate"})
_MIN_ARGUMENT = 8  # shorter string arguments (a flag, a path) match too easily to name a parent
_MIN_SUMMARY_LINE = 12
_SIDE_KINDS = ("summary", "auxiliary")
_TAG = re.compile(r"</?[A-Za-z_][A-Za-z0-9_-]*>")


class _Chain(Protocol):
    number: int
    turns: list
    tools_key: bytes
    lineage: Lineage | None
    answer: dict | None
    calls: list[tuple[int, dict]]  # (turn index, a tool call this server returned on it)
    claimed: set[str]  # ids of its calls that opened a chain

    @property
    def messages(self) -> list[dict]: ...


def place(chains: Sequence[_Chain], messages: list[dict], tools_key: bytes,
          request_kind: str | None) -> tuple[Lineage, str | None]:
    """The lineage of a new chain that starts with `messages` (normalised), given the rollout's chains so far, and
    the id of the tool call that opened it (None unless linked by one): the caller claims it on the parent while
    the chain lives (a chain whose first turn failed gives it back, so that the agent's retry finds it again)."""
    answered = [c for c in chains if c.turns]
    body = messages[1:] if messages[0]["role"] == "system" else messages
    if request_kind == "compaction":  # it summarises its parent as it stands: from the parent's latest turn
        parent, _ = _longest_history(_primary(answered), body)
        return Lineage("summary", *_at(parent or _latest(answered), None), "history" if parent else "timing"), None
    resumed = _summarised(answered, body)
    if resumed is not None:
        return resumed, None
    if request_kind == "subagent":  # the agent says so: under its tool call, else the history it starts from
        opened = _opening_call(_primary(answered), body)
        if opened is not None:
            return opened
        parent, turn = _longest_history(_primary(answered), body)
        return Lineage("subagent", *_at(parent or _latest(answered), turn if parent else None),
                       "history" if parent else "timing"), None
    parent, turn = _longest_history([c for c in _primary(answered) if c.tools_key == tools_key], body)
    if parent is not None:
        return Lineage("fork", parent.number, turn, "history"), None
    if tools_key:
        opened = _opening_call(_primary(answered), body)
        if opened is not None:
            return opened
        if not any(c.lineage is not None and c.lineage.kind == "main" for c in chains):
            return Lineage("main"), None
    latest = _latest(answered)
    return Lineage("auxiliary" if not tools_key else "subagent", *_at(latest, None), "timing"), None


def _primary(chains: Iterable[_Chain]) -> list[_Chain]:
    return [c for c in chains if c.lineage is None or c.lineage.kind not in _SIDE_KINDS]


def _latest(chains: Sequence[_Chain]) -> _Chain | None:
    primary = _primary(chains)
    return primary[-1] if primary else (chains[-1] if chains else None)


def _at(chain: _Chain | None, turn: int | None) -> tuple[int | None, int | None]:
    if chain is None:
        return None, None
    return chain.number, len(chain.turns) - 1 if turn is None else turn


def _longest_history(chains: Iterable[_Chain], body: list[dict]) -> tuple[_Chain | None, int | None]:
    """The chain sharing the longest run of messages (after the system prompt) with `body`, at least one, and the
    index of its last turn inside that run (None when the run ends before its first turn)."""
    best, best_shared = None, 0
    for chain in chains:
        recorded = chain.messages
        recorded = recorded[1:] if recorded and recorded[0]["role"] == "system" else recorded
        shared = 0
        for old, new in zip(recorded, body):
            if old != new and message_key(old) != message_key(new):
                break
            shared += 1
        if shared and shared >= best_shared:
            best, best_shared = chain, shared
    if best is None:
        return None, None
    recorded = best.messages
    recorded = recorded[1:] if recorded and recorded[0]["role"] == "system" else recorded
    answers = [i for i, m in enumerate(recorded) if m["role"] == "assistant"][-len(best.turns):]
    inside = sum(i < best_shared for i in answers)
    return best, inside - 1 if inside else None


def _summarised(chains: Sequence[_Chain], body: list[dict]) -> Lineage | None:
    """A compaction's resumed chain: one of its messages carries a summary this server wrote (in a user message, or
    as an assistant turn of its own history, as OpenCode resumes)."""
    text = "\n".join(m["content"] for m in body if isinstance(m.get("content"), str))
    if not text:
        return None
    for chain in reversed(chains):
        if chain.lineage is None or chain.lineage.kind != "summary" or chain.answer is None:
            continue
        summary = _TAG.sub("", chain.answer.get("content") or "")  # agents unwrap <summary> and the like
        lines = [line.strip() for line in summary.splitlines() if len(line.strip()) >= _MIN_SUMMARY_LINE]
        if any(line in text for line in lines or [summary.strip()] if line):
            lineage = chain.lineage
            return Lineage("compaction", lineage.parent, lineage.parent_turn, "summary")
    return None


def _opening_call(chains: Sequence[_Chain], body: list[dict]) -> tuple[Lineage, str] | None:
    """A sub-agent: its opening user messages carry a string argument of an unclaimed tool call."""
    opening = []
    for message in body:
        if message["role"] == "assistant":
            break
        if message["role"] == "user" and isinstance(message.get("content"), str):
            opening.append(message["content"])
    opening = "\n".join(opening)
    if not opening:
        return None
    candidates = [(chain, turn, call) for chain in reversed(chains) for turn, call in reversed(chain.calls)
                  if call.get("id") not in chain.claimed]  # fmt: skip
    candidates.sort(key=lambda c: c[2]["function"]["name"].rpartition(".")[2] not in SUBAGENT_TOOLS)  # stable
    for chain, turn, call in candidates:
        if any(len(value) >= _MIN_ARGUMENT and value in opening for value in _strings(call["function"]["arguments"])):
            return Lineage("subagent", chain.number, turn, "tool_call"), call.get("id")
    return None


def _strings(arguments: str) -> list[str]:
    """The string values of a call's JSON arguments (top level), stripped."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return []
    values = parsed.values() if isinstance(parsed, dict) else ()
    return [v.strip() for v in values if isinstance(v, str)]
