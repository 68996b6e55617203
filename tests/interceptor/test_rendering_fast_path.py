"""The renderer's fast path (transformers' compiled template without the deep copy, a memoised `tojson`, the Rust
tokenizer, long texts encoded in chunks) gives exactly what the reference path gives, for every chat template TRL
ships and conversations with tools, tool calls (string and object arguments), reasoning and tool results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from interceptor.errors import BadRequest
from interceptor.tokens.rendering import Renderer, RendererConfig
from interceptor.tokens.templates import trl_chat_template

_TRL = importlib.util.find_spec("trl")
TEMPLATES = sorted(
    p.stem for p in (Path(next(iter(_TRL.submodule_search_locations))) / "chat_templates").glob("*.jinja")
) if _TRL else []

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a <command> & read \"its\" output",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "read", "description": "Read a file (UTF-8: é, 中文)",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
]
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}
OBJECT_CALL = {"id": "c2", "type": "function", "function": {"name": "read", "arguments": {"path": "a.txt"}}}
CONVERSATIONS = [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "list files"}], TOOLS),
    ([{"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
      {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
      {"role": "assistant", "content": "Two files.", "reasoning_content": "I listed them."},
      {"role": "user", "content": "read a"},
      {"role": "assistant", "content": "", "tool_calls": [OBJECT_CALL]},
      {"role": "tool", "tool_call_id": "c2", "content": "contents"}], TOOLS),
]


@pytest.fixture(scope="module")
def base_renderer(tiny_model_dir) -> Renderer:
    return Renderer(RendererConfig(model_dir=tiny_model_dir))


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_fast_render_is_the_reference_render_for_every_trl_template(tiny_model_dir, name):
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir, chat_template=trl_chat_template(name)))
    compared = 0
    for messages, tools in CONVERSATIONS:
        for generation_prompt in (False, True):
            try:
                reference = renderer.render_text_reference(messages, tools, generation_prompt=generation_prompt)
            except BadRequest:  # the template refuses this conversation: so must the fast path
                with pytest.raises(BadRequest):
                    renderer.render_text(messages, tools, generation_prompt=generation_prompt)
                continue
            for _ in range(2):  # the second render reads the memoised tool JSON
                assert renderer.render_text(messages, tools, generation_prompt=generation_prompt) == reference
            compared += 1
    assert compared >= 2, f"{name} rendered almost nothing: the comparison proves little"


def test_the_memoised_tojson_follows_a_new_tool_list_with_the_same_contents_changed(base_renderer):
    messages = CONVERSATIONS[1][0]
    first = base_renderer.render_text(messages, TOOLS, generation_prompt=True)
    changed = [TOOLS[0], {**TOOLS[1], "function": {**TOOLS[1]["function"], "description": "Read it"}}]
    second = base_renderer.render_text(messages, changed, generation_prompt=True)
    assert "Read it" in second and "Read it" not in first
    assert second == base_renderer.render_text_reference(messages, changed, generation_prompt=True)


def test_a_long_text_encoded_in_chunks_gives_the_ids_of_one_encode(base_renderer):
    messages = [{"role": "system", "content": "You are an agent."}]
    for i in range(300):
        messages.append({"role": "user", "content": f"output line {i}: déjà vu 中文 {{'k': {i}}}\n" * 5})
        messages.append({"role": "assistant", "content": f"ok {i}"})
    text = base_renderer.render_text(messages, TOOLS, generation_prompt=True)
    assert len(text) > 64 * 1024
    expected = base_renderer.tokenizer.encode(text, add_special_tokens=False)
    assert base_renderer.encode(text) == expected
    assert base_renderer.render_full(messages, TOOLS) == expected


def test_a_short_text_is_encoded_to_the_ids_of_the_tokenizers_own_encode(base_renderer):
    for text in ("", "a", "<|im_end|>\n<|im_start|>user\nhi", "déjà vu 中文 \t\n  x" * 7):
        assert base_renderer.encode(text) == base_renderer.tokenizer.encode(text, add_special_tokens=False)


PROBING_TEMPLATE = (
    "{%- set ns = namespace(seen=0, label='x') %}"
    "{%- for message in messages %}"
    "{%- set ns.seen = ns.seen + 1 %}"
    "{{ loop.cycle('odd', 'even') }}|{{ loop.index0 }}|{{ loop.last }}|{{ ns.seen }}|{{ ns.label.upper() }}|"
    "{{ message.role }}|{{ message.content.strip().split(' ')[0] }}|{{ message.missing is defined }}|"
    "{{ message.get('role') }}|{{ message['content'] }}|{{ message.items()|list|length }}|"
    "{{ message.keys is defined }}|{{ (message.extra.items is callable) if message.extra is mapping else '' }}|"
    "{{ message.__class__ is defined }}|{{ message.content._private is defined }}|"
    "{{ '{0}-{1}'.format(message.role, ns.seen) }}|{{ ns.nothing is defined }}|{{ loop.__class__ is defined }}{{ '\\n' }}"
    "{%- endfor %}"
)


def test_the_fast_attribute_lookup_answers_as_the_sandbox_does_for_items_methods_and_unsafe_names(tiny_model_dir):
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir, chat_template=PROBING_TEMPLATE))
    messages = [{"role": "system", "content": " You are an agent. "},
                {"role": "user", "content": "go now", "extra": {"items": 3, "keys": "k"}},
                {"role": "assistant", "content": "done", "items": "an item named like a dict method"}]
    reference = renderer.render_text_reference(messages, None, generation_prompt=False)
    assert renderer.render_text(messages, None, generation_prompt=False) == reference
    lines = reference.splitlines()
    assert lines[0].startswith("odd|0|False|1|X|system|You|False|system|") and "|system-1|" in lines[0]
    assert "|False|False|" in lines[0]  # __class__ and _private stay hidden
    assert lines[2].startswith("odd|2|True|3|")


def test_the_sandbox_still_refuses_what_it_refuses_on_the_fast_path(tiny_model_dir):
    for template in ("{{ messages[0].update({'role': 'x'}) }}", "{{ messages.__class__.__mro__ }}",
                     "{{ messages[0].content.__class__.__subclasses__() }}"):
        renderer = Renderer(RendererConfig(model_dir=tiny_model_dir, chat_template=template))
        messages = [{"role": "user", "content": "hi"}]
        try:
            reference = renderer.render_text_reference(messages, None, generation_prompt=False)
        except BadRequest:
            with pytest.raises(BadRequest):
                renderer.render_text(messages, None, generation_prompt=False)
        else:
            assert renderer.render_text(messages, None, generation_prompt=False) == reference
            assert "object" not in reference and "subclasses" not in reference
