"""vLLM's request checks that both endpoints share: the model name, prompt token ids, the context length (with
vLLM's wording, from its renderer and input processor), and how sampling defaults are chosen."""

from __future__ import annotations

from collections.abc import Sequence

from trainer.engine.errors import InvalidRequest, NotFound
from trainer.engine.sampling import SamplingParams

__all__ = ["build_sampling_params", "check_context_length", "check_model", "check_prompt_ids"]


def build_sampling_params(defaults: dict, *, max_tokens: int, **fields) -> SamplingParams:
    """Request fields over the model's generation_config defaults over OpenAI's defaults (vLLM's priority)."""
    openai_defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    for name, default in openai_defaults.items():
        if fields[name] is None:
            fields[name] = defaults.get(name, default)
    fields["top_k"] = max(int(fields["top_k"]), 0)
    return SamplingParams(max_tokens=max_tokens, **fields)


def check_model(requested: str | None, served: str) -> None:
    if requested and requested != served:
        raise NotFound(f"The model `{requested}` does not exist.")


def check_prompt_ids(prompt_ids: Sequence[int], vocab_size: int) -> None:
    if not prompt_ids:
        raise InvalidRequest("The decoder prompt cannot be empty")
    largest = max(prompt_ids)
    if largest >= vocab_size:
        raise InvalidRequest(f"Token id {largest} is out of vocabulary")


def check_context_length(prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """vLLM's length checks (renderer, then input processor); return the max_tokens to generate with."""
    requested = max_tokens or 0
    if requested > max_model_len:
        # vLLM's wording, verbatim (including its missing space).
        raise InvalidRequest(
            f"max_tokens={requested}cannot be greater than max_model_len=max_total_tokens={max_model_len}. "
            "Please request fewer output tokens.",
            param="max_tokens",
            value=requested,
        )
    if prompt_len > max_model_len - requested:
        raise InvalidRequest(
            f"You passed {prompt_len} input tokens and requested {requested} output tokens. However, the "
            f"model's context length is only {max_model_len} tokens, resulting in a maximum input length of "
            f"{max_model_len - requested} tokens. Please reduce the length of the input prompt.",
            param="input_tokens",
            value=prompt_len,
        )
    if prompt_len == max_model_len:
        raise InvalidRequest(
            f"The decoder prompt (length {prompt_len}) plus the number of requested output tokens (at least 1) is "
            f"longer than the maximum model length of {max_model_len}. Make sure that `max_model_len` is no "
            "smaller than the number of text tokens (prompt + requested output tokens)."
        )
    return min(max_tokens or max_model_len, max_model_len - prompt_len)
