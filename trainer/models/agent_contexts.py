"""What an agent's request looks like around its task, read from a captured first request: the messages before and
after the user's task, the tools, and the shape of the agent's shell tool. The embedded default is trained behind
these (`trainer.models.tool_episodes`), so that it answers inside the real agents' prompts.

Captures live in `trainer/models/agent_requests/` (chat completions for Pi and OpenCode, Messages for Claude Code,
Responses for Codex) and are read with the server's own dialect parsers, so the training sees the conversation the
gate renders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SHELL_TOOLS", "Context", "load_agent_request"]

# The agents' shell tools, (name, argument): Pi and OpenCode, Claude Code, Codex.
SHELL_TOOLS = (("bash", "command"), ("Bash", "command"), ("exec_command", "cmd"))


@dataclass(frozen=True)
class Context:
    """What an episode's task is asked within: the messages around the user's task (an agent's request has its
    own: Claude Code prefixes the task with a reminder and follows it with a system message), the tools, and the
    shell tool's (name, argument)."""

    before: tuple[dict, ...]  # e.g. the system prompt
    tools: tuple[dict, ...]
    shell: tuple[str, str]
    task_prefix: str = ""  # text the agent puts in the task's message before the task itself
    after: tuple[dict, ...] = ()  # messages the agent sends after the task's (before the model answers)

    def messages(self, task: dict) -> list[dict]:
        return [*self.before, {**task, "content": self.task_prefix + task["content"]}, *self.after]


def _task_text(body: dict) -> str:
    """The raw text of the last user message's last text part: the agent's instruction."""
    items = body.get("input") if "input" in body else body.get("messages")
    users = [m for m in items or () if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    if isinstance(content, list):
        texts = [part.get("text", "") for part in content if isinstance(part, dict) and "text" in part]
        return texts[-1] if texts else ""
    return content if isinstance(content, str) else ""


def load_agent_request(path: Path) -> Context:
    """An agent's captured first request: the messages around its task, and its tools, which must include a shell
    tool of one of the agents' shapes. The capture is either the request body or `{"request": body, ...}`, in chat
    completions, Messages (a `system`, or tools with `input_schema`) or Responses (`input`) form, read with the
    server's own dialect parsers."""
    from interceptor.wire.dialects.messages import MESSAGES
    from interceptor.wire.dialects.responses import RESPONSES
    from interceptor.wire.protocol import normalize_messages

    body = json.loads(Path(path).read_text(encoding="utf-8"))
    body = body.get("request", body)
    if "input" in body:
        chat = RESPONSES.parse(body)
        messages, tools = chat.messages, chat.tools or []
    elif "system" in body or any("input_schema" in t for t in body.get("tools") or () if isinstance(t, dict)):
        chat = MESSAGES.parse_for_count(body)
        messages, tools = chat.messages, chat.tools or []
    else:
        messages = normalize_messages(body["messages"])
        tools = [t for t in body.get("tools") or () if isinstance(t, dict)]
    offered = {(t.get("function", {}).get("name"), arg) for t in tools
               for arg in t.get("function", {}).get("parameters", {}).get("properties", {})}
    shell = next((shape for shape in SHELL_TOOLS if shape in offered), None)
    if shell is None:
        raise ValueError(f"{path}: the request's tools have no shell tool of a known shape {SHELL_TOOLS}")
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    content, task = messages[last_user]["content"], _task_text(body)
    if not task or not content.endswith(task):
        raise ValueError(f"{path}: the last user message does not end with the instruction")
    return Context(before=tuple(messages[:last_user]), tools=tuple(tools), shell=shell,
                   task_prefix=content[: len(content) - len(task)], after=tuple(messages[last_user + 1:]))
