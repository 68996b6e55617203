"""A steady turn's suffix written without the chat template, for the Qwen templates whose text says how.

Every turn of a tool loop renders the same thing: the text after the last assistant turn's end-of-turn token,
which is the template's separator, the agent's new messages (tool results, now and then a user or system message)
and the generation prompt. `Renderer.render_suffix` renders a small context through the template for it (and, for
where the assistant turn ends, that context once more): two Jinja renders per turn, a fifth of a busy gate's CPU.

For the templates named in `CHATML_TOOL_TEMPLATES` (Qwen2.5, Qwen3, Qwen3-Instruct-2507 and TRL's training
variants of each, identified by the sha256 of their exact text, as TRL's `chat_templates/` ships them) that text
is, by reading them:
- an assistant message ends with `<|im_end|>` and a newline, so the suffix starts with that newline;
- a run of `tool` messages is one user turn: `<|im_start|>user`, then for each `\\n<tool_response>\\n`, its
  content, `\\n</tool_response>`, and `<|im_end|>\\n` after the run's last;
- a `user` message, and a `system` message that is not the conversation's first, is `<|im_start|>` + role +
  `\\n` + content + `<|im_end|>\\n`;
- the generation prompt is `<|im_start|>assistant\\n` (Qwen3's `enable_thinking`, which the gate never passes,
  is the only variable that would change it);
and none of these reads the content, the message's other fields, the system message, the tools or the assistant
turn before them. `chatml_suffix` writes exactly that, and declines (None) anything else: another role, a content
that is not a string. A template outside the list is rendered as before, whatever it looks like.

`Renderer` checks the writer against the template on `probe_cases()` when it loads (the texts must be equal) and,
while serving, renders one suffix in `AUDIT_EVERY` through the template too: a difference turns the writer off for
the rest of the process, is logged and counted, and that turn takes the template's suffix.

Another template joins the list only once its text has been read for the points above (what ends an assistant
turn, how tool results, user and later system messages and the generation prompt are written, that nothing there
reads a content or any other message): its TRL name and the sha256 of its text go into `CHATML_TOOL_TEMPLATES`,
and `tests/interceptor/test_suffix_writer.py` holds the writer to it. A template that writes these otherwise
(Llama 3's headers, Qwen3-VL's system messages) needs a writer of its own, not this one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

from interceptor.errors import BadRequest

__all__ = ["AUDIT_EVERY", "CHATML_TOOL_TEMPLATES", "checked_writer", "chatml_suffix", "probe_cases", "writer_for"]

AUDIT_EVERY = 64  # one written suffix in this many is also rendered through the template and compared

# TRL's file name -> sha256 of its text (trl/chat_templates/<name>.jinja)
CHATML_TOOL_TEMPLATES = {
    "qwen2_5": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "qwen2_5_training": "0cd86fb80f520885e35040a8df321540e729d3358da41f27cf74d33103d94f62",
    "qwen3": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
    "qwen3_training": "1d944ff8f268b611abb296cdd24d0f51981eef1c8647ac321c3a0258f61eb6c9",
    "qwen3_instruct_2507": "64f85b198065d0fba2a81f37e10ed68161ce2c19a754c7100e67e0ca2ee9c326",
    "qwen3_instruct_2507_training": "48e17aa3caf5bf20075b6e7366864ee943e00b6f0752aadfe8b670c2ab0291a5",
}
_probed: dict[tuple[str, str], str] = {}  # (template, end-of-turn text) -> why the probe failed, or ""


def writer_for(template: str) -> str | None:
    """The name of the template `chatml_suffix` writes for, or None when `template` is none of them."""
    digest = hashlib.sha256(template.encode("utf-8")).hexdigest()
    return next((name for name, known in CHATML_TOOL_TEMPLATES.items() if known == digest), None)


def checked_writer(
    template: str, end_of_turn: str, rendered_suffix: Callable[..., str | None]
) -> tuple[str | None, str]:
    """The template's name in `CHATML_TOOL_TEMPLATES` and "" when `chatml_suffix` writes its suffixes (the template
    is one of those, and `rendered_suffix`, the renderer's, gives the written text on every probe), else None and
    why not. A template is probed once per process and end-of-turn token."""
    name = writer_for(template)
    if name is None:
        return None, "the chat template is none of those whose suffix is written (suffix_writer.py)"
    key = (template, end_of_turn)
    if key not in _probed:
        _probed[key] = _probe(rendered_suffix)
    if _probed[key]:
        return None, f"the written suffix differs from the template's {name} on a probe: {_probed[key]}"
    return name, ""


def _probe(rendered_suffix: Callable[..., str | None]) -> str:
    for system, assistant, new, tools in probe_cases():
        try:
            reference = rendered_suffix(system=system, last_assistant=assistant, new_messages=new, tools=tools)
        except BadRequest as exc:
            return f"the template rejected a probe ({exc.message})"
        if chatml_suffix(new) != reference:
            roles = ", ".join(m["role"] for m in new)
            return f"new messages ({roles}) after an assistant turn of {len(assistant['content'])} characters"
    return ""


def chatml_suffix(new_messages: list[dict]) -> str | None:
    """The text after the last assistant turn's end-of-turn token, for these new messages and the generation
    prompt, as the templates in `CHATML_TOOL_TEMPLATES` render it; None for messages it does not write."""
    out = ["\n"]
    in_tool_run = False
    for message in new_messages:
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str):
            return None
        if role == "tool":
            out.append("\n<tool_response>\n" + content + "\n</tool_response>" if in_tool_run
                       else "<|im_start|>user\n<tool_response>\n" + content + "\n</tool_response>")
            in_tool_run = True
            continue
        if role not in ("user", "system"):
            return None
        if in_tool_run:
            out.append("<|im_end|>\n")
            in_tool_run = False
        out.append("<|im_start|>" + role + "\n" + content + "<|im_end|>\n")
    if in_tool_run:
        out.append("<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


_CONTENTS = (
    "ok", "", "  padded both sides \n", "line 1\nline 2\n", "<tool_response>inner</tool_response>",
    "a <|im_end|> b <|im_start|>user", "</think> after", "<think>x</think>", "{{ not a variable }} {% raw %}",
    "é ünïcode ✓ 中文", '"quoted" \\ back\tslash', "\n", "Error: exit code 1",
)
_ASSISTANTS = (
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
        {"id": "c2", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}}]},
    {"role": "assistant", "content": "Done.", "reasoning_content": "the task is done"},
    {"role": "assistant", "content": "<think>\nplan\n</think>\n\nDone."},
)
_TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def _new_messages() -> Iterator[list[dict]]:
    for content in _CONTENTS:
        yield [{"role": "tool", "tool_call_id": "c1", "content": content}]
        yield [{"role": "user", "content": content}]
    yield [{"role": "tool", "tool_call_id": "c1", "content": "a"},
           {"role": "tool", "tool_call_id": "c2", "content": ""}]
    yield [{"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "user", "content": "go on"},
           {"role": "tool", "tool_call_id": "c2", "content": "b"}]
    yield [{"role": "system", "content": "<env>cwd: /w</env>"}, {"role": "user", "content": "next"}]
    yield [{"role": "user", "content": "q"}, {"role": "system", "content": "note"}]
    yield [{"role": "tool", "tool_call_id": "c1", "content": "a", "name": "read_file"},
           {"role": "system", "content": "reminder"}]


def probe_cases() -> Iterator[tuple[dict | None, dict, list[dict], list[dict] | None]]:
    """(system, last assistant, new messages, tools) that the load-time check renders both ways: every kind of new
    messages (tool results, user and system messages, runs and mixes, texts with the templates' own markers, special
    tokens, whitespace, quotes and non-ASCII) after a tool call with a system message and tools, and one of them
    after every kind of assistant turn (plain, reasoning, tool calls), with and without a system message and tools."""
    system = {"role": "system", "content": "You are a coding agent."}
    for new in _new_messages():
        yield system, _ASSISTANTS[0], new, _TOOLS
    for with_system in (False, True):
        for tools in (None, _TOOLS):
            for assistant in _ASSISTANTS:
                yield (system if with_system else None), assistant, [{"role": "tool", "content": "x\ny"}], tools
