"""Stop-hooks: rules under which a rollout stops before its agent runs a tool call the policy sampled.

    rules = parse_stop_rules([{"name": "no-network", "pattern": r"\\b(curl|wget)\\b", "tools": ["bash"]}])
    hit = first_hit(rules, message)     # the assistant message the gate is about to return

A rule names a regular expression searched in every string of a tool call's arguments (the JSON decoded, so a
command reads as the agent will run it) and in the tool's name; `tools`, when given, limits it to those tools. The
gate checks the message after the turn is recorded, so the sample holds exactly what the policy sampled; the agent
gets an error in its API's shape instead of the call, and every later call of the rollout gets the same error.
Rules never rewrite what the model sampled. Command patterns, paths and hosts are all patterns over the arguments.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson

from interceptor.errors import ApiError, BadRequest

__all__ = ["PolicyStopped", "StopHit", "StopRule", "first_hit", "parse_stop_rules"]

_MAX_RULES = 64
_MAX_PATTERN = 1000


class PolicyStopped(ApiError):
    """The rollout was stopped by a stop rule: its agent gets this for the call that matched and every later one."""

    status = 403
    type = "permission_error"
    code = "policy_stop"


@dataclass(frozen=True, slots=True)
class StopRule:
    name: str
    pattern: re.Pattern[str]
    tools: tuple[str, ...] = ()  # empty: every tool


@dataclass(frozen=True, slots=True)
class StopHit:
    rule: str
    tool: str
    arguments: str  # the call's arguments as sampled (JSON text)


def parse_stop_rules(value: object, *, param: str = "stop_rules") -> tuple[StopRule, ...]:
    """Rules from their JSON form (a list of `{"name", "pattern", "tools"?}`); BadRequest naming what is wrong."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > _MAX_RULES:
        raise BadRequest(f"{param} must be a list of at most {_MAX_RULES} rules", param=param)
    rules = []
    for index, item in enumerate(value):
        where = f"{param}[{index}]"
        if not isinstance(item, dict) or set(item) - {"name", "pattern", "tools"}:
            raise BadRequest(f"{where} must be an object with name, pattern and optionally tools", param=param)
        name, pattern, tools = item.get("name"), item.get("pattern"), item.get("tools", [])
        if not isinstance(name, str) or not name or not isinstance(pattern, str) or not pattern:
            raise BadRequest(f"{where} needs a non-empty name and pattern", param=param)
        if len(pattern) > _MAX_PATTERN:
            raise BadRequest(f"{where}: pattern longer than {_MAX_PATTERN} characters", param=param)
        if not isinstance(tools, list) or not all(isinstance(tool, str) and tool for tool in tools):
            raise BadRequest(f"{where}: tools must be a list of tool names", param=param)
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise BadRequest(f"{where}: pattern is not a regular expression: {exc}", param=param) from exc
        rules.append(StopRule(name=name, pattern=compiled, tools=tuple(tools)))
    return tuple(rules)


def first_hit(rules: Sequence[StopRule], message: dict) -> StopHit | None:
    """The first rule a tool call of `message` (an OpenAI assistant message) matches, or None."""
    if not rules:
        return None
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        tool, arguments = str(function.get("name", "")), str(function.get("arguments", ""))
        texts = [tool, *_strings(arguments)]
        for rule in rules:
            if rule.tools and tool not in rule.tools:
                continue
            if any(rule.pattern.search(text) for text in texts):
                return StopHit(rule=rule.name, tool=tool, arguments=arguments)
    return None


def _strings(arguments: str) -> Iterator[str]:
    """Every string in the arguments' JSON (the raw text when it is not JSON: a malformed call is checked too)."""
    try:
        decoded = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        yield arguments
        return
    stack = [decoded]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
