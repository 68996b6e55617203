"""`POST /v1/completions` with vLLM's request fields, checks, error wording and response shape.

Request: `prompt` (token ids, a string, or a one-element list of either), `max_tokens` (default 16), `temperature`,
`top_p`, `top_k` (-1 or 0: off), `seed` (-1: none), `stop_token_ids`, `ignore_eos`, `n` (1 only), `logprobs`,
`prompt_logprobs`, `min_tokens`, `logit_bias`, `return_token_ids`, `model` (must be the served name when given).
Unknown fields are accepted, ignored and logged once; known vLLM features this engine does not implement (stop
strings, penalties, echo, streaming, ...) are refused with a 400 rather than ignored: they would change the sample.

Response, as vLLM 0.31 builds it (every key of tests/data/vllm_completion_example.json, nulls included):
`choices[0]` has `text` (special tokens skipped; the eos or stop token that ended the generation is in `token_ids`
but not in `text`), `logprobs` in the OpenAI completions layout (`text_offset`, `token_logprobs`, `tokens`,
`top_logprobs`; -inf clamped to -9999.0), `finish_reason`, `stop_reason`, `token_ids`/`prompt_token_ids` when
`return_token_ids`, and `prompt_logprobs` (None, then per position `{token_id: {logprob, rank, decoded_token}}`)
when asked. `system_fingerprint` names the weight version that sampled the last token (vLLM puts its own version).
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from trainer.engine.errors import InvalidRequest
from trainer.engine.generation import GenerationResult
from trainer.engine.http.checks import build_sampling_params
from trainer.engine.http.fields import is_int, read_bool, read_float, read_int, read_int_list, read_str
from trainer.engine.logprobs import TokenLogprob
from trainer.engine.sampling import SamplingParams
from trainer.engine.textcodec import TokenTexts

__all__ = ["CompletionRequest", "completion_response", "parse_completion_request"]

log = logging.getLogger(__name__)

_INT64 = (-(2**63), 2**63 - 1)
_LOGPROB_FLOOR = -9999.0  # vLLM's stand-in for -inf in JSON
# vLLM request fields that change what is sampled, and the value at which they change nothing.
_UNSUPPORTED = {
    "echo": (False,),
    "stream": (False,),
    "stop": ("", []),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "allowed_token_ids": ([],),
    "bad_words": ([],),
    "use_beam_search": (False,),
    "suffix": ("",),
    "prompt_embeds": ([],),
    "response_format": ({"type": "text"},),
    "structured_outputs": (),
    "logprob_token_ids": (),
}
_READ = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "ignore_eos", "n",
    "logprobs", "prompt_logprobs", "min_tokens", "logit_bias", "return_token_ids",
})


@dataclass(frozen=True, kw_only=True)
class CompletionRequest:
    model: str | None
    prompt: tuple[int, ...] | str
    max_tokens: int
    temperature: float | None  # None: the model's generation_config default, else 1.0
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    logprobs: int | None
    prompt_logprobs: int | None
    min_tokens: int
    logit_bias: tuple[tuple[int, float], ...]
    return_token_ids: bool

    def sampling_params(self, defaults: dict, *, max_tokens: int | None = None) -> SamplingParams:
        return build_sampling_params(
            defaults,
            max_tokens=max_tokens or self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            min_tokens=self.min_tokens,
            logit_bias=self.logit_bias,
        )


def parse_completion_request(body: dict, *, max_logprobs: int, vocab_size: int) -> CompletionRequest:
    for name in body.keys() - _READ - _UNSUPPORTED.keys():
        _log_ignored(name)
    for name, neutral in _UNSUPPORTED.items():
        if body.get(name) is not None and body[name] not in neutral:
            raise InvalidRequest(f"`{name}` is not supported by the local engine", param=name, value=body[name])
    n = read_int(body, "n", default=1)
    if n != 1:
        raise InvalidRequest(f"the local engine generates one sequence per request; got n={n}", param="n", value=n)
    max_tokens = read_int(body, "max_tokens", default=16)
    if max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens", value=max_tokens)
    top_k = read_int(body, "top_k", default=None)
    if top_k is not None and top_k < -1:
        raise InvalidRequest(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    min_tokens = read_int(body, "min_tokens", default=0)
    if min_tokens < 0:
        raise InvalidRequest(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        raise InvalidRequest(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    seed = read_int(body, "seed", default=None)
    if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
        raise InvalidRequest("seed must be a 64-bit signed integer", param="seed", value=seed)
    return CompletionRequest(
        model=read_str(body, "model"),
        prompt=_prompt(body.get("prompt")),
        max_tokens=max_tokens,
        temperature=_temperature(body),
        top_p=_top_p(body),
        top_k=None if top_k is None else max(top_k, 0),
        seed=None if seed == -1 else seed,
        stop_token_ids=read_int_list(body, "stop_token_ids"),
        ignore_eos=read_bool(body, "ignore_eos"),
        logprobs=_logprobs(body, "logprobs", max_logprobs=max_logprobs, vocab_size=vocab_size),
        prompt_logprobs=_logprobs(body, "prompt_logprobs", max_logprobs=max_logprobs, vocab_size=vocab_size),
        min_tokens=min_tokens,
        logit_bias=_logit_bias(body, vocab_size=vocab_size),
        return_token_ids=read_bool(body, "return_token_ids"),
    )


@functools.cache
def _log_ignored(name: str) -> None:
    """Say once per field name that it was ignored (as vLLM does for every request)."""
    log.warning("ignoring the /v1/completions field %r: the local engine does not use it", name)


# ----------------------------------------------------------------------------------------------- response


def completion_response(
    result: GenerationResult, request: CompletionRequest, *, model: str, texts: TokenTexts
) -> dict:
    choice = {
        "index": 0,
        "text": texts.text(result),
        "logprobs": None if result.logprobs is None else _completion_logprobs(result.logprobs, texts),
        "finish_reason": result.finish_reason,
        "stop_reason": result.stop_reason,
        "token_ids": list(result.token_ids) if request.return_token_ids else None,
        "prompt_logprobs": None if result.prompt_logprobs is None else _prompt_logprobs(result.prompt_logprobs, texts),
        "prompt_token_ids": list(result.prompt_ids) if request.return_token_ids else None,
        "routed_experts": None,
    }
    prompt_tokens, completion_tokens = len(result.prompt_ids), len(result.token_ids)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "service_tier": None,
        # vLLM puts its version here; the engine puts the weights' version, which a trainer can check for staleness.
        "system_fingerprint": f"local-engine-weights-v{result.weight_version}",
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _completion_logprobs(records: Sequence[TokenLogprob], texts: TokenTexts) -> dict:
    offsets, logprobs, tokens, tops = [], [], [], []
    offset = 0
    for record in records:
        token = texts.token(record.token_id)
        offsets.append(offset)
        offset += len(token)
        logprobs.append(_finite(record.logprob))
        tokens.append(token)
        # vLLM keys by token id first (the sampled token, then the top ones), then by decoded text.
        by_id = dict([(record.token_id, record.logprob), *record.top])
        tops.append({texts.token(token_id): _finite(value) for token_id, value in by_id.items()})
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens, "top_logprobs": tops}


def _prompt_logprobs(entries: Sequence[TokenLogprob | None], texts: TokenTexts) -> list[dict | None]:
    out: list[dict | None] = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        ranked = [(entry.token_id, entry.logprob, entry.rank)]
        ranked += [(token_id, value, rank) for rank, (token_id, value) in enumerate(entry.top, start=1)]
        out.append(
            {
                str(token_id): {"logprob": _finite(value), "rank": rank, "decoded_token": texts.token(token_id)}
                for token_id, value, rank in ranked
            }
        )
    return out


def _finite(value: float) -> float:
    return max(value, _LOGPROB_FLOOR)


# ----------------------------------------------------------------------------------------------- fields


def _prompt(prompt: object) -> tuple[int, ...] | str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch of one
    if prompt is None or prompt == "":
        raise InvalidRequest("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, (list, str)) for p in prompt):
            raise InvalidRequest(
                f"the local engine takes one prompt per request; got {len(prompt)}", param="prompt"
            )
        if all(is_int(t) and t >= 0 for t in prompt):
            return tuple(prompt)
        raise InvalidRequest(
            "prompt must be a string or a list of non-negative integer token ids", param="prompt"
        )
    raise InvalidRequest("prompt must be a string or a list of token ids", param="prompt")


def _temperature(body: dict) -> float | None:
    value = read_float(body, "temperature")
    if value is None:
        return None
    if not math.isfinite(value):
        raise InvalidRequest(f"temperature must be a finite number, got {value}.", param="temperature", value=value)
    if value < 0.0:
        raise InvalidRequest(f"temperature must be non-negative, got {value}.", param="temperature", value=value)
    if value > 2.0:
        raise InvalidRequest(f"temperature must be in [0, 2], got {value}.", param="temperature", value=value)
    return value


def _top_p(body: dict) -> float | None:
    value = read_float(body, "top_p")
    if value is not None and not 0.0 < value <= 1.0:
        raise InvalidRequest(f"top_p must be in (0, 1], got {value}.", param="top_p", value=value)
    return value


def _logprobs(body: dict, name: str, *, max_logprobs: int, vocab_size: int) -> int | None:
    value = read_int(body, name, default=None)
    if value is None:
        return None
    if value < -1:
        raise InvalidRequest(f"`{name}` must be a positive value or -1.", param=name, value=value)
    if value == -1:  # the whole vocabulary
        value = vocab_size
    if value > max_logprobs:
        kind = "sample" if name == "logprobs" else "prompt"
        raise InvalidRequest(
            f"Requested {kind} logprobs of {value}, which is greater than max allowed: {max_logprobs}",
            param=name,
            value=value,
        )
    return value


def _logit_bias(body: dict, *, vocab_size: int) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequest(f"`logit_bias` must be an object, got {value!r}", param="logit_bias")
    bias: dict[int, float] = {}
    bad_keys = []
    for key, amount in value.items():
        try:
            token_id = int(key)
        except ValueError:
            bad_keys.append(key)
            continue
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise InvalidRequest(f"logit_bias values must be numbers, got {amount!r}", param="logit_bias")
        bias[token_id] = min(100.0, max(-100.0, float(amount)))  # vLLM's clamp
    if bad_keys:
        raise InvalidRequest(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad_keys!r}",
            param="logit_bias",
            value=bad_keys,
        )
    outside = [token_id for token_id in bias if not 0 <= token_id < vocab_size]
    if outside:
        raise InvalidRequest(
            f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. Vocabulary size: {vocab_size}",
            param="logit_bias",
            value=outside,
        )
    return tuple(bias.items())
