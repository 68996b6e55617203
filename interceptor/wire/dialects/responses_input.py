"""The Responses dialect's request parts: input items into the gate's messages, tools, tool choice and the scalar
(the rules are in `interceptor.wire.dialects.responses`)."""

from __future__ import annotations

import re

from interceptor.errors import BadRequest

__all__ = ["convert_items", "input_messages", "split_name", "tool_choice", "tools"]

_TEXT_PARTS = frozenset({"input_text", "output_text"})
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a namespace's name: no ".", which joins it to its functions' names


def input_messages(items: object) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be a string or a non-empty list of items", param="input")
    messages, _ = convert_items(items, start=0, offset=0)
    if not messages:
        raise BadRequest("input holds no message", param="input")
    return messages


def convert_items(items: list, *, start: int, offset: int) -> tuple[list[dict], tuple[int, ...]]:
    """The input items (numbered from `start`) as messages, and for each item where its messages end in a list
    already holding `offset` messages, or -1 where the conversion cannot resume after it (a reasoning item waits
    for its assistant turn, or the last message is an assistant's, which a function call would join)."""
    messages: list[dict] = []
    ends: list[int] = []
    reasoning: str | None = None  # from a reasoning item, for the assistant turn that follows it
    for i, item in enumerate(items, start=start):
        reasoning = _add_item(item, f"input[{i}]", messages, reasoning)
        clean = reasoning is None and (not messages or messages[-1]["role"] != "assistant")
        ends.append(offset + len(messages) if clean else -1)
    return messages, tuple(ends)


def _add_item(item: object, param: str, messages: list[dict], reasoning: str | None) -> str | None:
    """Add what `item` says to `messages`; the reasoning still waiting for its assistant turn."""
    if not isinstance(item, dict):
        raise BadRequest(f"{param} must be an object", param=param)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "reasoning":
        return _reasoning_text(item, param) or None
    if kind == "message":
        message = _message(item, param)
    elif kind == "function_call":
        call = _function_call(item, param)
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and reasoning is None:
            last.setdefault("tool_calls", []).append(call)  # the same turn: text, then its calls
            return None
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise BadRequest(f"{param}.call_id must be a string", param=f"{param}.call_id")
        message = {"role": "tool", "tool_call_id": item["call_id"],
                   "content": _text_of(item.get("output"), f"{param}.output")}  # fmt: skip
    else:
        raise BadRequest(f"{param}: item type {kind!r} is not supported; send message, function_call, "
                         "function_call_output and reasoning items", param=param)  # fmt: skip
    if message["role"] == "assistant" and reasoning is not None:
        message["reasoning_content"] = reasoning
    messages.append(message)
    return None


def _message(item: dict, param: str) -> dict:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise BadRequest(f"{param}.role must be user, system, developer or assistant", param=f"{param}.role")
    content = _text_of(item.get("content"), f"{param}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def _function_call(item: dict, param: str) -> dict:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise BadRequest(f"{param}.{key} must be a string", param=f"{param}.{key}")
    namespace = item.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and _NAME.fullmatch(namespace)):
        raise BadRequest(f"{param}.namespace must be a name of letters, digits, _ and -", param=f"{param}.namespace")
    name = f"{namespace}.{item['name']}" if namespace else item["name"]
    return {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": item["arguments"]}}


def _reasoning_text(item: dict, param: str) -> str:
    """The reasoning's text (`content`, else `summary`), or "" when it is encrypted only."""
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                   for p in parts):  # fmt: skip
            raise BadRequest(f"{param}.{key} must be a list of text parts", param=f"{param}.{key}")
        if parts:
            return "\n".join(p["text"] for p in parts)
    return ""


def _text_of(content: object, param: str) -> str:
    """A string, or input_text/output_text parts joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{param} must be a string or a list of text parts", param=param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):  # checked first: a list or an object cannot be looked up in _TEXT_PARTS
            raise BadRequest(f"{param}[{j}] must be an object whose type is a string", param=param)
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise BadRequest(f"{param}[{j}]: {kind} parts are not supported; send text only", param=param)
        else:
            raise BadRequest(f"{param}[{j}] must be an input_text or output_text part", param=param)
    return "\n".join(texts)


def tools(tools: object, *, relayed: bool = False) -> list[dict] | None:
    """Function tools; a `namespace` tool's functions (Codex's sub-agent tools) each as a function named
    `NAMESPACE.NAME`, which the reply splits back into `namespace` and `name` (`split_name`)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            out.extend(_namespace(tool, param))
            continue
        if kind != "function" and relayed and kind is not None:
            continue  # a built-in tool: the upstream runs it; the trace has no form for it
        out.append(_function_tool(tool, param))
    return out or None


def _namespace(tool: dict, param: str) -> list[dict]:
    name, inner = tool.get("name"), tool.get("tools")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or not isinstance(inner, list) or not inner:
        raise BadRequest(f"{param}: a namespace tool needs a name of letters, digits, _ and -, and a list of "
                         "function tools", param=param)  # fmt: skip
    functions = [_function_tool(t, f"{param}.tools[{j}]") for j, t in enumerate(inner)]
    for function in functions:
        function["function"]["name"] = f"{name}.{function['function']['name']}"
    return functions


def _function_tool(tool: object, param: str) -> dict:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise BadRequest(f"{param}: tool type {kind!r} is not supported; define it as a function tool",
                         param=param)  # fmt: skip
    parameters = tool.get("parameters")
    if not isinstance(tool.get("name"), str) or not isinstance(parameters, (dict, type(None))):
        raise BadRequest(f"{param} needs a name, and parameters as an object", param=param)
    function: dict = {"name": tool["name"]}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def split_name(name: str) -> dict:
    """A tool call's name as Responses writes it: `{"name": ...}`, with `namespace` for a namespaced function."""
    namespace, dot, inner = name.partition(".")
    return {"name": inner, "namespace": namespace} if dot else {"name": name}


def tool_choice(choice: object) -> str:
    if choice is None or choice == "auto":
        return "auto"
    if choice == "none":
        return "none"
    if choice == "required" or isinstance(choice, dict):
        raise BadRequest("tool_choice 'required' or naming a tool is not supported: the policy's own sampling "
                         "decides whether it calls a tool (use 'auto' or 'none')", param="tool_choice")  # fmt: skip
    raise BadRequest("tool_choice must be 'auto' or 'none'", param="tool_choice")
