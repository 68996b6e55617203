"""Per-position logprob records, gathered from a [N, V] logprob tensor as vLLM gathers them.

For each position: the chosen token's logprob and rank (1 + the number of tokens with a strictly higher logprob,
counted as vLLM does: tokens with logprob >= the chosen one's), and the `n` most likely tokens, best first.

Prompt logprobs are taken a chunk of positions at a time (`prompt_logprobs`): logits, log-softmax and the rank
comparison are each [chunk, V], so memory grows with the chunk, not with the prompt. Each position's record comes
from its own row alone, and every chunk has the same number of rows (the last one starts early and overlaps the
one before), so each product runs with the same BLAS kernel: a one-row product rounds differently (by ~1e-6) from a
many-row one, and a lone last row would otherwise differ from the same row computed in a full chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TokenLogprob", "gather_logprobs", "prompt_logprobs"]


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


def prompt_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, token_ids: torch.Tensor, n: int, *, chunk: int
) -> list[TokenLogprob]:
    """Records for the positions of `hidden` [N, H], each predicting its token of `token_ids` [N] through the output
    embedding `head`, `chunk` positions at a time; raw logprobs (log-softmax of the float32 logits)."""
    rows = token_ids.shape[0]
    records: list[TokenLogprob] = []
    for start in range(0, rows, chunk):
        begin = max(0, min(start, rows - chunk))  # a full chunk, ending at the last row: rows before `start` are done
        logits = head(hidden[begin:start + chunk]).float()[start - begin:]
        records += gather_logprobs(logits.log_softmax(dim=-1), token_ids[start:start + chunk], n)
        del logits  # freed before the next chunk's are made, not after
    return records
