"""Loading the policy (model, tokenizer, stop tokens, default sampling) and replacing its weights in place.

Stop tokens follow vLLM: the tokenizer's eos is *the* eos (a stop there reports `stop_reason` None); the other
`eos_token_id`s of `generation_config.json` are added to each request's stop_token_ids unless it sets `ignore_eos`
(so a stop there reports that id as `stop_reason`). Default temperature/top_p/top_k come from
`generation_config.json` when it sets them (vLLM's `--generation-config auto`).

Weights are replaced by name, in place (`copy_` into the existing parameters), all or nothing: every name and shape
is checked before anything is copied. Names are the model's `state_dict()` keys, which are the names
`save_pretrained` writes (tied weights are listed under both names; either updates the shared tensor).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["PolicyModel", "apply_weights", "load_policy", "read_safetensors_dir"]

_DEFAULT_SAMPLING_KEYS = ("temperature", "top_p", "top_k")


@dataclass(frozen=True, kw_only=True)
class PolicyModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    eos_token_id: int | None
    extra_eos_token_ids: tuple[int, ...]
    vocab_size: int  # rows of the input embedding (= width of the logits): valid token ids are below it
    max_position_embeddings: int
    default_sampling: dict[str, float | int]


def load_policy(path: Path, *, device: str = "cpu", dtype: str = "float32") -> PolicyModel:
    """Load a transformers causal LM directory on `device` with `dtype` weights, in eval mode."""
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            found = torch.cuda.device_count() if torch.cuda.is_available() else "no"
            raise ValueError(f"device {device!r} asked for, but torch sees {found} CUDA device(s) "
                             f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device)
    model.eval()
    config = model.config.get_text_config(decoder=True)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        # The batch keeps one left-padded KV cache per layer; sliding-window layers would need per-row windows.
        raise ValueError(f"{path}: only full-attention models are supported, this one has layers {sorted(layer_types)}")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    generation = _generation_config(path)
    eos = tokenizer.eos_token_id
    configured = generation.get("eos_token_id")
    configured_ids = [configured] if isinstance(configured, int) else list(configured or [])
    if eos is None and configured_ids:
        eos = configured_ids[0]
    extra = tuple(dict.fromkeys(i for i in configured_ids if i != eos))
    return PolicyModel(
        model=model,
        tokenizer=tokenizer,
        eos_token_id=eos,
        extra_eos_token_ids=extra,
        vocab_size=model.get_input_embeddings().num_embeddings,
        max_position_embeddings=config.max_position_embeddings,
        default_sampling={k: generation[k] for k in _DEFAULT_SAMPLING_KEYS if generation.get(k) is not None},
    )


def _generation_config(path: Path) -> dict:
    file = Path(path) / "generation_config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def read_safetensors_dir(path: Path | str) -> list[tuple[str, torch.Tensor]]:
    """All tensors of the `*.safetensors` files in a directory (one file or shards), by name."""
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"weights_path {str(path)!r} is not a directory")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {str(path)!r}")
    try:
        return [item for file in files for item in load_file(str(file)).items()]
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"cannot read weights from {str(path)!r}: {exc}") from exc


def apply_weights(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy tensors into the model's parameters and buffers by name; return how many were copied."""
    targets = model.state_dict(keep_vars=True)
    updates = list(named_tensors)
    for name, tensor in updates:
        target = targets.get(name)
        if target is None:
            raise ValueError(f"unknown weight {name!r} (not in the model's state_dict)")
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(target.shape)}")
    with torch.no_grad():
        for name, tensor in updates:
            targets[name].copy_(tensor)
    return len(updates)
