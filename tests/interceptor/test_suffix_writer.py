"""A steady turn's suffix written without the chat template (`suffix_writer.py`) is the template's own suffix for
every template it is used with, and is used with no other: a template outside its list, messages it does not write,
and a difference found while serving all leave the suffix to the template."""

from __future__ import annotations

import hashlib
import logging
import random

import pytest

import interceptor.tokens.rendering as rendering
import interceptor.tokens.suffix_writer as suffix_writer
from interceptor.tokens.rendering import Renderer, RendererConfig
from interceptor.tokens.suffix_writer import AUDIT_EVERY, CHATML_TOOL_TEMPLATES, chatml_suffix, probe_cases
from interceptor.tokens.templates import trl_chat_template

SYSTEM = {"role": "system", "content": "You are a coding agent."}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]
# Pieces of text a tool result or a user turn may hold: the templates' markers and special tokens among them
PIECES = ["x", " ", "\n", "\t", "<tool_response>", "</tool_response>", "<|im_end|>", "<|im_start|>", "user",
          "<think>", "</think>", "{{", "}}", "{%", '"', "\\", "é", "中", "Error:", "<tool_call>", "assistant"]


def _random_messages(rng: random.Random) -> list[dict]:
    messages = []
    for _ in range(rng.randint(1, 4)):
        content = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        role = rng.choice(["tool", "tool", "tool", "user", "system"])
        messages.append({"role": role, "content": content} | ({"tool_call_id": "c1"} if role == "tool" else {}))
    return messages


def test_the_trl_templates_in_the_list_are_the_texts_that_were_read():
    for name, digest in CHATML_TOOL_TEMPLATES.items():
        assert hashlib.sha256(trl_chat_template(name).encode("utf-8")).hexdigest() == digest, name


@pytest.mark.parametrize("name", sorted(CHATML_TOOL_TEMPLATES))
def test_the_written_suffix_is_the_templates_own_for_every_listed_template(tiny_model_dir, name):
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir, chat_template=trl_chat_template(name)))
    assert renderer.suffix_writer == name and renderer.suffix_writer_absent_because == ""
    cases = list(probe_cases())
    rng = random.Random(name)
    cases += [(rng.choice([None, SYSTEM]), CALL, _random_messages(rng), rng.choice([None, TOOLS])) for _ in range(300)]
    for system, assistant, new, tools in cases:
        reference = renderer.rendered_suffix(system=system, last_assistant=assistant, new_messages=new, tools=tools)
        assert chatml_suffix(new) == reference, (name, new)
        ids = renderer.render_suffix(system=system, last_assistant=assistant, new_messages=new, tools=tools)
        assert ids == renderer.encode(reference)
    assert renderer.suffix_mismatches == 0 and renderer.suffix_writer == name


def test_the_embedded_default_and_the_benchmarks_template_gets_the_writer(tiny_model_dir):
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir))
    assert renderer.template == trl_chat_template("qwen3")
    assert renderer.writes_suffixes and renderer.suffix_writer == "qwen3"


def test_a_template_outside_the_list_renders_its_suffix_through_the_template(tiny_model_dir):
    edited = trl_chat_template("qwen3").replace("'\\n<tool_response>\\n'", "'\\n<tool_response> \\n'")
    assert edited != trl_chat_template("qwen3")
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir, chat_template=edited))
    assert renderer.suffix_writer is None and "none of those" in renderer.suffix_writer_absent_because
    new = [{"role": "tool", "tool_call_id": "c1", "content": "out"}]
    ids = renderer.render_suffix(system=SYSTEM, last_assistant=CALL, new_messages=new, tools=TOOLS)
    assert renderer.tokenizer.decode(ids).startswith("\n<|im_start|>user\n<tool_response> \nout")


def test_suffix_writer_off_in_the_config_renders_through_the_template(tiny_model_dir):
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir, suffix_writer=False))
    assert renderer.suffix_writer is None and renderer.suffix_writer_absent_because == "not asked for"
    assert not renderer.writes_suffixes


def test_a_listed_template_that_fails_the_probe_gets_no_writer(tiny_model_dir, monkeypatch):
    """A template the list names but whose suffixes differ (here qwen3_5_think's, whose generation prompt opens a
    thinking block) is caught when it loads."""
    monkeypatch.setattr(suffix_writer, "writer_for", lambda template: "claimed")
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir, chat_template=trl_chat_template("qwen3_5_think")))
    assert renderer.suffix_writer is None
    assert "differs from the template's claimed on a probe" in renderer.suffix_writer_absent_because


@pytest.mark.parametrize("new", [
    [{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "parts"}]}],
    [{"role": "developer", "content": "a role the writer does not know"}],
])
def test_messages_the_writer_declines_are_rendered_through_the_template(tiny_model_dir, new):
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir))
    assert renderer.writes_suffixes and chatml_suffix(new) is None
    reference = renderer.rendered_suffix(system=SYSTEM, last_assistant=CALL, new_messages=new, tools=TOOLS)
    ids = renderer.render_suffix(system=SYSTEM, last_assistant=CALL, new_messages=new, tools=TOOLS)
    assert ids == (None if reference is None else renderer.encode(reference))
    assert renderer.suffix_writer == "qwen3"


def test_a_written_suffix_that_differs_from_the_templates_turns_the_writer_off(tiny_model_dir, monkeypatch, caplog):
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir))
    assert renderer.writes_suffixes
    monkeypatch.setattr(rendering, "chatml_suffix", lambda new: "\n<|im_start|>user\nnot what the template says")
    new = [{"role": "tool", "tool_call_id": "c1", "content": "out"}]
    reference = renderer.encode(
        renderer.rendered_suffix(system=SYSTEM, last_assistant=CALL, new_messages=new, tools=TOOLS))
    with caplog.at_level(logging.ERROR, logger="interceptor.tokens.rendering"):
        answers = [renderer.render_suffix(system=SYSTEM, last_assistant=CALL, new_messages=new, tools=TOOLS)
                   for _ in range(AUDIT_EVERY + 1)]
    # the written text until the audit, which finds the difference: the template's from then on
    assert all(ids != reference for ids in answers[:AUDIT_EVERY - 1])
    assert answers[AUDIT_EVERY - 1] == reference and answers[AUDIT_EVERY] == reference
    assert renderer.suffix_writer is None and renderer.suffix_mismatches == 1 and not renderer.writes_suffixes
    assert "differed from the chat template's" in caplog.text
