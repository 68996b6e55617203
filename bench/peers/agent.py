"""The agent side of bench_gate.py: tool-loop conversations as coding agents send them, and the direct call the gate
makes upstream.

Every request carries the whole history and 10 tools; the fake upstream's answer is always a `read_file` tool call,
and the "agent" appends a tool result of `result_lines` lines (about TOKENS_PER_LINE tokens each). A conversation
keeps the target's own prompt-token count: exact from the gate, an estimate (bytes/4) from the fake upstream.
Every conversation has its own task (the first user message differs), so a proxy that caches what it computed for
one body cannot serve another rollout's turn from it; the system prompt and the tools are shared, as in training.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import aiohttp
import orjson

from .launch import Endpoint, Target

__all__ = ["TOKENS_PER_LINE", "TOOLS", "Conversation", "chat_turn", "open_conversation", "tokens_turn"]

TOKENS_PER_LINE = 22  # of `_tool_output`'s lines, measured with the Qwen tokenizer; the gate reports the truth
_TOOL_ARGS = {"read_file": ("path",), "write_file": ("path", "content"), "edit_file": ("path", "old", "new"),
              "list_dir": ("path",), "grep": ("pattern", "path"), "run_shell": ("command",), "run_tests": ("selector",),
              "search_docs": ("query",), "git_diff": ("ref",), "finish": ("summary",)}
TOOLS = [  # 10 tools in every request, as coding agents send them
    {"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ')} in the workspace",
        "parameters": {"type": "object", "required": list(args),
                       "properties": {arg: {"type": "string", "description": f"the {arg}"} for arg in args}}}}
    for name, args in _TOOL_ARGS.items()
]


def _tool_output(lines: int, seed: int) -> str:
    return "\n".join(f"{seed + i:05d}    result = handler_{i % 97}(request, retries=3)  # ok" for i in range(lines))


@dataclass
class Conversation:
    """One rollout as the load generator drives it."""

    target: Target
    endpoint: Endpoint
    messages: list[dict]
    prompt_tokens: int = 0  # the target's own count (the gate's is exact; the fake upstream's an estimate)
    turns: int = 0


_task_numbers = itertools.count()  # every conversation's task differs, so no proxy can reuse another's work


def _first_messages(task_lines: int) -> list[dict]:
    task = next(_task_numbers)
    listing = _tool_output(task_lines, task % 90 * 1000)  # 5-digit line numbers: ~TOKENS_PER_LINE tokens a line
    return [{"role": "system", "content": "You are a coding agent. Use the tools to fix the failing test."},
            {"role": "user", "content": f"Fix the bug of task {task}.\n{listing}"}]


async def open_conversation(http: aiohttp.ClientSession, target: Target, task_lines: int = 4) -> Conversation:
    return Conversation(target, await target.open(http), _first_messages(task_lines))


async def chat_turn(http: aiohttp.ClientSession, convo: Conversation, result_lines: int) -> float:
    """One turn: post the history, append the tool call and its result. Returns the seconds the post took."""
    data = orjson.dumps({"model": "policy", "messages": convo.messages, "tools": TOOLS, "max_tokens": 64})
    started = time.perf_counter()
    async with http.post(convo.endpoint.chat_url, data=data, headers=convo.endpoint.headers) as resp:
        raw = await resp.read()
    elapsed = time.perf_counter() - started
    if resp.status != 200:
        raise RuntimeError(f"{convo.target.name} answered {resp.status}: {raw[:500]!r}")
    body = orjson.loads(raw)
    message = body["choices"][0]["message"]
    convo.messages.append(message)
    call_id = message["tool_calls"][0]["id"]
    convo.messages.append({"role": "tool", "tool_call_id": call_id, "content": _tool_output(result_lines, convo.turns)})
    convo.prompt_tokens = int(body.get("usage", {}).get("prompt_tokens") or 0)
    convo.turns += 1
    return elapsed


async def tokens_turn(http: aiohttp.ClientSession, upstream: str, prompt_tokens: int) -> float:
    """What the gate sends upstream for a turn: /v1/completions with the prompt as token ids."""
    data = orjson.dumps({"model": "instant", "prompt": list(range(1000, 1000 + prompt_tokens)), "max_tokens": 64,
                         "return_token_ids": True, "logprobs": 0})
    started = time.perf_counter()
    async with http.post(upstream + "/v1/completions", data=data, headers={"Content-Type": "application/json"}) as r:
        await r.read()
    return time.perf_counter() - started
