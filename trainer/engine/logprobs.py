"""Per-position logprob records, gathered from a [N, V] logprob tensor as vLLM gathers them.

For each position: the chosen token's logprob and rank (1 + the number of tokens with a strictly higher logprob,
counted as vLLM does: tokens with logprob >= the chosen one's), and the `n` most likely tokens, best first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TokenLogprob", "gather_logprobs"]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]  # (token id, logprob) of the n most likely tokens, best first


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, n: int) -> list[TokenLogprob]:
    """Records for rows of `logprobs` [N, V] and the chosen `token_ids` [N]; `n` = -1 means the whole vocabulary."""
    if logprobs.shape[0] == 0:
        return []
    n = logprobs.shape[1] if n < 0 else min(n, logprobs.shape[1])
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs >= chosen).sum(dim=1)
    top_values, top_ids = logprobs.topk(n, dim=1)
    return [
        TokenLogprob(token_id=token, logprob=value, rank=rank, top=tuple(zip(ids, values, strict=True)))
        for token, value, rank, ids, values in zip(
            token_ids.tolist(), chosen.squeeze(1).tolist(), ranks.tolist(), top_ids.tolist(), top_values.tolist(),
            strict=True,
        )
    ]
