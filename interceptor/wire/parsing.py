"""Turn a model's sampled text into an OpenAI assistant message: content, reasoning and tool calls.

Formats understood (the ones Qwen-family templates teach):
- reasoning: `<think>...</think>` at the start (or only `</think>` when the prompt opened the block);
- Hermes/Qwen JSON tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`;
- Qwen3-Coder XML tool calls: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.

A tool call that cannot be parsed is never dropped: the whole text stays in `content` and `malformed` is set, so
the agent sees what the model wrote and the turn is flagged in the record. Tool-call ids are made by the caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["ParsedCall", "ParsedOutput", "parse_output"]

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None
    reasoning: str | None
    calls: tuple[ParsedCall, ...]
    malformed: bool  # a tool call was attempted but could not be parsed; its text is left in `content`


def parse_output(text: str, *, tools: list[dict] | None = None, calls_allowed: bool = True) -> ParsedOutput:
    """Split sampled text into reasoning, content and tool calls.

    `tools` (the request's OpenAI tool list) lets XML parameters, which are untyped text, take the type their
    JSON schema declares. Without `calls_allowed` (a request with no tools, or `tool_choice: "none"`) nothing is
    a tool call: what the model wrote after its reasoning is the content.
    """
    reasoning, rest = _split_reasoning(text)
    if not calls_allowed or "<tool_call>" not in rest:
        return ParsedOutput(content=rest or None, reasoning=reasoning, calls=(), malformed=False)
    try:
        calls = tuple(_parse_call(block, tools) for block in _CALL_BLOCK.findall(rest))
    except ValueError:
        return ParsedOutput(content=rest, reasoning=reasoning, calls=(), malformed=True)
    outside = _CALL_BLOCK.sub("", rest)
    if not calls or "<tool_call>" in outside or "</tool_call>" in outside:
        # An unclosed block (cut by the length limit) or stray tags: not a call we can execute.
        return ParsedOutput(content=rest, reasoning=reasoning, calls=(), malformed=True)
    content = outside.strip()
    return ParsedOutput(content=content or None, reasoning=reasoning, calls=calls, malformed=False)


def _split_reasoning(text: str) -> tuple[str | None, str]:
    if _THINK_CLOSE not in text:
        stripped = text.lstrip()
        if stripped.startswith(_THINK_OPEN):  # still thinking when the turn ended
            return stripped[len(_THINK_OPEN):].strip("\n") or None, ""
        return None, text
    head, _, tail = text.partition(_THINK_CLOSE)
    head = head.lstrip()
    if head.startswith(_THINK_OPEN):
        head = head[len(_THINK_OPEN):]
    elif _THINK_OPEN in head:  # text before the block is not reasoning; keep the whole output as content
        return None, text
    return head.strip("\n") or None, tail.lstrip("\n")


def _parse_call(block: str, tools: list[dict] | None) -> ParsedCall:
    body = block.strip()
    if body.startswith("<function="):
        return _parse_xml_call(body, tools)
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool call is not JSON: {exc}") from exc
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError("tool call JSON has no name")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models emit the arguments already encoded
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ValueError("tool call arguments are not JSON") from exc
    if not isinstance(arguments, dict):
        raise ValueError("tool call arguments are not an object")
    return ParsedCall(name=call["name"], arguments=json.dumps(arguments, ensure_ascii=False))


def _parse_xml_call(body: str, tools: list[dict] | None) -> ParsedCall:
    match = _XML_FUNCTION.fullmatch(body)
    if match is None:
        raise ValueError("tool call XML is not one <function=...> element")
    name, inner = match.group(1).strip(), match.group(2)
    schema = _parameter_schema(tools, name)
    arguments = {}
    for param, raw in _XML_PARAMETER.findall(inner):
        arguments[param.strip()] = _typed_value(raw, schema.get(param.strip(), {}))
    if _XML_PARAMETER.sub("", inner).strip():
        raise ValueError("tool call XML has text outside its parameters")
    return ParsedCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _parameter_schema(tools: list[dict] | None, name: str) -> dict:
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            return properties if isinstance(properties, dict) else {}
    return {}


def _typed_value(raw: str, schema: dict):
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in (None, "string") or isinstance(kind, list) and "string" in kind:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # the schema said otherwise, but the model wrote text: pass it on as written
