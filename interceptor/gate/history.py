"""When two messages are the same turn of a conversation: how the gate matches an agent's history to what it
recorded (`trajectory.py`), places a new chain (`lineage.py`) and how the relay compares histories."""

from __future__ import annotations

import functools
import json

import orjson

__all__ = ["message_key", "same_history"]


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


def same_history(recorded: list[dict], incoming: list[dict]) -> bool:
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
