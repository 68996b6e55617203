"""Sampled text -> OpenAI assistant message: reasoning, Hermes/Qwen JSON and Qwen3-Coder XML tool calls; what
cannot be parsed stays in the content and is flagged, never dropped."""

from __future__ import annotations

import json

import pytest

from interceptor.tokens.rendering import Renderer, RendererConfig
from interceptor.tokens.templates import trl_chat_template
from interceptor.wire.parsing import parse_output

TOOLS = [{"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "force": {"type": "boolean"}}}}}]


def test_plain_text_is_content():
    parsed = parse_output("Hello.")
    assert (parsed.content, parsed.reasoning, parsed.calls, parsed.malformed) == ("Hello.", None, (), False)


def test_reasoning_block_becomes_reasoning_content():
    parsed = parse_output("<think>\nstep by step\n</think>\n\nThe answer is 5.")
    assert parsed.reasoning == "step by step" and parsed.content == "The answer is 5."


def test_reasoning_opened_by_the_prompt_is_split_at_the_closing_tag():
    parsed = parse_output("still thinking\n</think>\n\ndone")
    assert parsed.reasoning == "still thinking" and parsed.content == "done"


def test_hermes_json_calls_with_text_around_them():
    text = 'Let me check.\n<tool_call>\n{"name": "edit", "arguments": {"path": "a.py"}}\n</tool_call>\n' \
           '<tool_call>\n{"name": "edit", "arguments": {"path": "b.py"}}\n</tool_call>'
    parsed = parse_output(text)
    assert parsed.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("edit", {"path": "a.py"}), ("edit", {"path": "b.py"})]


def test_qwen3_coder_xml_call_with_typed_parameters():
    text = "<tool_call>\n<function=edit>\n<parameter=path>\nsrc/x.py\n</parameter>\n<parameter=line>\n12\n</parameter>\n" \
           "<parameter=force>\ntrue\n</parameter>\n</function>\n</tool_call>"
    (call,) = parse_output(text, tools=TOOLS).calls
    assert call.name == "edit" and json.loads(call.arguments) == {"path": "src/x.py", "line": 12, "force": True}


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "edit", "arguments": {"path": \n</tool_call>',  # broken JSON
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "edit", "arguments": {"path": "a.py"}}',  # cut by the length limit
        "<tool_call>\n<function=edit>\nstray text\n</function>\n</tool_call>",  # XML with text outside parameters
    ],
)
def test_unparseable_calls_stay_as_text_and_are_flagged(text):
    parsed = parse_output(text, tools=TOOLS)
    assert parsed.calls == () and parsed.malformed and parsed.content == text


def test_training_template_is_trls_prefix_preserving_variant(tiny_model_dir):
    plain = Renderer(RendererConfig(model_dir=tiny_model_dir))
    training = Renderer(RendererConfig(model_dir=tiny_model_dir, training_template=True))
    assert plain.template == trl_chat_template("qwen3")
    assert training.template == trl_chat_template("qwen3_training")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
                {"role": "user", "content": "q2"}]
    # Qwen3's own template drops reasoning of earlier turns; the training variant keeps it
    assert "<think>\nr\n</think>" not in plain.render_text(messages, None, generation_prompt=True)
    assert "<think>\nr\n</think>" in training.render_text(messages, None, generation_prompt=True)
