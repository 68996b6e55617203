"""Choosing the next token for a batch of sequences, the way vLLM's V1 sampler does.

Order of operations (vLLM `vllm/v1/sample/sampler.py` and `ops/topk_topp_sampler.py`):
1. logits in float32; `raw_logprobs` are `log_softmax(logits)`, taken here, before anything else.
2. logit processors that can change the argmax: `logit_bias` is added, and while a request has fewer than
   `min_tokens` tokens its stop tokens (eos, generation_config eos ids, stop_token_ids) are set to -inf.
3. greedy rows (temperature < 1e-5) take the argmax of step 2's logits; their temperature, top-k, top-p are off.
4. other rows: divide by the temperature, mask by top-k then top-p (ties at the k-th value are kept; top-p keeps
   the smallest set whose probability reaches p, at least one token), then sample with exponential noise
   (`argmax(probs / q)`, q ~ Exp(1)), which is exact sampling from `softmax`. Each row draws its noise from its own
   generator, so a seeded request gets the same tokens whatever else is in the batch.
5. `processed_logprobs` are `log_softmax` of the logits after steps 2 and 4 (masked tokens are -inf); for greedy
   rows, after step 2 only, as in vLLM, where greedy rows skip temperature, top-k and top-p.
Penalties and the other vLLM processors are not supported (requests asking for them are refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer.engine.config import LogprobsMode

__all__ = ["GREEDY_EPS", "MIN_TEMPERATURE", "RowSampling", "SamplingParams", "apply_top_k_top_p", "sample_next"]

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature means greedy
MIN_TEMPERATURE = 1e-2  # vLLM raises temperatures in (0, 0.01) to 0.01 to keep softmax finite


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top logprobs per sampled token (the sampled token's own is always given)
    prompt_logprobs: int | None = None  # top logprobs per prompt position
    min_tokens: int = 0  # stop tokens are masked until this many tokens are generated
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) added to the logits

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or positive, got {self.top_k}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if self.greedy:  # as vLLM: greedy ignores top-k and top-p
            object.__setattr__(self, "top_p", 1.0)
            object.__setattr__(self, "top_k", 0)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


@dataclass(frozen=True, slots=True)
class RowSampling:
    """One row's sampling settings for a step; `generator` is the request's own (seeded) or the engine's."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator
    logit_bias: tuple[tuple[int, float], ...] = ()
    banned: tuple[int, ...] = ()  # token ids that may not be sampled this step (min_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def sample_next(
    logits: torch.Tensor, rows: Sequence[RowSampling], *, logprobs_mode: LogprobsMode, with_logprobs: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample one token per row of `logits` [B, V]; return the token ids [B] and, when asked, the logprobs [B, V]
    of `logprobs_mode` that the sampled tokens are reported with."""
    logits = logits.float()
    raw = logits.log_softmax(dim=-1) if with_logprobs else None
    logits = _apply_processors(logits, rows)
    processed = with_logprobs and logprobs_mode == "processed_logprobs"
    logprobs = logits.log_softmax(dim=-1) if processed else raw
    tokens = logits.argmax(dim=-1)
    random_rows = [i for i, row in enumerate(rows) if not row.greedy]
    if not random_rows:
        return tokens, logprobs
    device = logits.device
    index = torch.tensor(random_rows, device=device)
    scaled = logits[index] / torch.tensor([rows[i].temperature for i in random_rows], device=device).unsqueeze(1)
    top_k = [rows[i].top_k for i in random_rows]
    top_p = [rows[i].top_p for i in random_rows]
    vocab = logits.shape[-1]
    masked = apply_top_k_top_p(
        scaled,
        None if not any(top_k) else torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_k], device=device),
        None if all(p >= 1.0 for p in top_p) else torch.tensor(top_p, device=device),
    )
    probs = masked.softmax(dim=-1)
    # The noise comes from each row's CPU generator whatever the device, so a seed samples alike on CPU and CUDA.
    noise = torch.empty(probs.shape, dtype=probs.dtype)
    for j, i in enumerate(random_rows):
        noise[j].exponential_(generator=rows[i].generator)
    tokens[index] = probs.div_(noise.to(device)).argmax(dim=-1)
    if processed:
        logprobs[index] = masked.log_softmax(dim=-1)
    return tokens, logprobs


def _apply_processors(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """logit_bias, then the min_tokens mask; on a copy, since `logits` may be the model's output."""
    changed = [i for i, row in enumerate(rows) if row.logit_bias or row.banned]
    if not changed:
        return logits
    logits = logits.clone()
    for i in changed:
        if rows[i].logit_bias:
            ids, biases = zip(*rows[i].logit_bias, strict=True)
            logits[i, list(ids)] += torch.tensor(biases, device=logits.device)
        if rows[i].banned:
            logits[i, list(rows[i].banned)] = float("-inf")
    return logits


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Mask logits [B, V] outside each row's top-k, then outside its top-p nucleus, with -inf.

    `k` [B] (V means off for that row) and `p` [B] (1.0 means off) follow vLLM's `apply_top_k_top_p_pytorch`.
    """
    if k is None and p is None:
        return logits
    ordered, order = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth_value = ordered.gather(1, (ordered.shape[1] - k).unsqueeze(1))
        ordered.masked_fill_(ordered < kth_value, float("-inf"))
    if p is not None:
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        outside = cumulative <= 1 - p.unsqueeze(1)
        outside[:, -1] = False  # always keep the most likely token
        ordered.masked_fill_(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ordered)
