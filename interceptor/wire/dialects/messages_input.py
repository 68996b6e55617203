"""The Messages dialect's request parts: system blocks, history elements (text, thinking, tool_use, tool_result
blocks) into the gate's messages, tools and tool choice (the rules are in `interceptor.wire.dialects.messages`)."""

from __future__ import annotations

import json

from interceptor.errors import BadRequest

__all__ = ["convert_messages", "system_messages", "tool_choice", "tools"]

# Claude Code's first system block, `x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;`, changes from
# request to request (a hash in the version); it is metadata for Anthropic's billing, not prompt.
_BILLING = "x-anthropic-billing-header:"


def system_messages(system: object) -> list[dict]:
    if isinstance(system, list):  # Claude Code's billing metadata is a block of its own: not prompt text
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(_BILLING))]
    if system is None or system == "" or system == []:
        return []
    return [{"role": "system", "content": _text_of(system, "system")}]


def _text_of(content: object, param: str) -> str:
    """A string, or text blocks joined with newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadRequest(f"{param}[{i}] must be a text block", param=param)
            texts.append(block["text"])
        return "\n".join(texts)
    raise BadRequest(f"{param} must be a string or a list of text blocks", param=param)


def convert_messages(messages: list, *, start: int, offset: int) -> tuple[list[dict], tuple[int, ...]]:
    """The history elements `messages` (numbered from `start`) as chat messages, and where each element's end in
    a list that already holds `offset` messages."""
    out: list[dict] = []
    ends: list[int] = []
    for i, message in enumerate(messages, start=start):
        param = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"{param} must be an object with role 'user', 'assistant' or 'system'", param=param)
        content = message.get("content")
        if message["role"] == "system":  # Claude Code sends its environment notes as a system message mid-list
            out.append({"role": "system", "content": _text_of(content, f"{param}.content")})
            ends.append(offset + len(out))
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise BadRequest(f"{param}.content must be a string or a list of blocks", param=f"{param}.content")
        if message["role"] == "user":
            out += _user(blocks, param)
        else:
            out.append(_assistant(blocks, param))
        ends.append(offset + len(out))
    return out, tuple(ends)


def _user(blocks: list, param: str) -> list[dict]:
    results, texts = [], []
    for j, block in enumerate(blocks):
        where = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise BadRequest(f"{where}.tool_use_id must be a string", param=where)
            content = block.get("content", "")
            text = "" if content is None else _text_of(content, f"{where}.content")
            if block.get("is_error") is True and not text.startswith("Error"):
                text = f"Error: {text}"  # the tool failed: say so, as the agent's own tool output does
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in ("image", "document", "search_result"):
            raise BadRequest(f"{where}: {kind} blocks are not supported; send text only", param=where)
        else:
            raise BadRequest(f"{where}: a user message holds text and tool_result blocks", param=where)
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])


def _assistant(blocks: list, param: str) -> dict:
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        where = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted reasoning this policy never produced: nothing to render
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise BadRequest(f"{where} needs id and name", param=where)
            try:
                arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            except (TypeError, ValueError, RecursionError) as exc:
                raise BadRequest(f"{where}.input cannot be serialised: {exc}", param=where) from exc
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
        else:
            raise BadRequest(f"{where}: an assistant message holds text, thinking and tool_use blocks", param=where)
    message: dict = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def tools(tools: object, *, relayed: bool = False) -> list[dict] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"{param} must be an object", param=param)
        kind = tool.get("type", "custom")
        if kind != "custom" and relayed:
            continue  # a server tool: the upstream runs it; the trace has no form for it
        if kind != "custom":
            raise BadRequest(f"{param}: server tool type {kind!r} is not supported; define it as a custom tool with "
                             "an input_schema", param=param)  # fmt: skip
        schema = tool.get("input_schema")
        if not isinstance(tool.get("name"), str) or not isinstance(schema, dict):
            raise BadRequest(f"{param} needs a name and an input_schema object", param=param)
        function = {"name": tool["name"], "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out or None


def tool_choice(choice: object) -> tuple[str, bool]:
    if choice is None:
        return "auto", True
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "none", "any", "tool"):
        raise BadRequest("tool_choice must be {'type': 'auto' | 'none' | 'any' | 'tool'}", param="tool_choice")
    if choice["type"] in ("any", "tool"):
        raise BadRequest(f"tool_choice {choice['type']!r} is not supported: the policy's own sampling decides whether "
                         "it calls a tool (use 'auto' or 'none')", param="tool_choice")  # fmt: skip
    parallel = choice.get("disable_parallel_tool_use", False)
    if not isinstance(parallel, bool):
        raise BadRequest("tool_choice.disable_parallel_tool_use must be a boolean", param="tool_choice")
    return choice["type"], not parallel
