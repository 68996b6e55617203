"""The running batch: sequences decoded together, one row each, over one left-padded KV cache.

A sequence joins after its own prefill (batch size 1, no padding), carrying a KV cache of its prompt. Joining
left-pads the shorter of the batch's cache and the newcomer's to a common length and stacks them; the attention
mask marks padding 0 and each row's real tokens 1. Rows are decoded together one token per step with explicit
position ids (each row's real position), so a row computes exactly what it would alone: padded keys get zero
attention weight and RoPE sees true positions. Keys are cached after RoPE, so padding never shifts them.
When rows leave, leading columns that are padding in every remaining row are dropped.

Invariant between steps: every row's cache holds its prompt and all its output tokens but the last one, which is
the input of the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

__all__ = ["DecodeBatch", "next_token_logits", "prefill"]

Row = TypeVar("Row")


def prefill(
    model: PreTrainedModel, prompt_ids: Sequence[int], cached: tuple[int, DynamicCache] | None = None,
) -> tuple[torch.Tensor, DynamicCache]:
    """Run a prompt alone through the decoder; return its last hidden states [1, P, H] and its KV cache. With
    `cached` (a length and a cache holding the prompt's first that many tokens: `prefix_cache.py`), only the rest
    is run, and the hidden states are those of the rest's positions.

    Logits are the output embedding of a hidden state, as the causal LM computes them (`lm_head(hidden)` in Qwen,
    Llama, Mistral; a model that scales or caps logits after its head is not served correctly): take them with
    `next_token_logits`, or a chunk of positions at a time for prompt logprobs, so that the full [P, vocabulary]
    logits never exist (7k positions x 151k tokens x 4 bytes = 4.3 GB per copy)."""
    start, cache = cached if cached is not None else (0, DynamicCache())
    output = model.get_decoder()(
        input_ids=torch.tensor([list(prompt_ids[start:])], device=model.device), past_key_values=cache, use_cache=True
    )
    return output.last_hidden_state, cache


def next_token_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The last position's logits [1, V] from `prefill`'s hidden states: what `model(..., logits_to_keep=1)` gives."""
    return model.get_output_embeddings()(hidden[:, -1:, :])[0]


class DecodeBatch(Generic[Row]):
    def __init__(self, model: PreTrainedModel) -> None:
        self._model = model
        self.rows: list[Row] = []
        self._positions: list[int] = []  # per row: tokens in its cache, i.e. the position of its next input token
        self._cache: DynamicCache | None = None
        self._device = model.device
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self._device)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: Row, cache: DynamicCache, length: int) -> None:
        """Add a row whose cache holds `length` tokens (its prompt)."""
        row_mask = torch.ones(1, length, dtype=torch.long, device=self._device)
        if self._cache is None:
            self._cache, self._mask = cache, row_mask
        else:
            width = max(self._mask.shape[1], length)
            own, new = width - self._mask.shape[1], width - length
            self._cache = DynamicCache(
                ddp_cache_data=[
                    (
                        torch.cat([_pad_left(k, own), _pad_left(nk, new)]),
                        torch.cat([_pad_left(v, own), _pad_left(nv, new)]),
                    )
                    for (k, v), (nk, nv) in zip(_layers(self._cache), _layers(cache), strict=True)
                ]
            )
            self._mask = torch.cat([F.pad(self._mask, (own, 0)), F.pad(row_mask, (new, 0))])
        self.rows.append(row)
        self._positions.append(length)

    def remove(self, rows: Sequence[Row]) -> None:
        gone = {id(row) for row in rows}
        keep = [i for i, row in enumerate(self.rows) if id(row) not in gone]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        self._positions = [self._positions[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, torch.zeros(0, 0, dtype=torch.long, device=self._device)
            return
        index = torch.tensor(keep, device=self._device)
        mask = self._mask[index]
        start = int(mask.any(dim=0).nonzero()[0])  # columns before this are padding in every remaining row
        self._mask = mask[:, start:]
        self._cache = DynamicCache(
            ddp_cache_data=[(k[index, :, start:], v[index, :, start:]) for k, v in _layers(self._cache)]
        )

    def step(self, input_ids: Sequence[int]) -> torch.Tensor:
        """Feed each row its next token (in row order); return the next-token logits [B, V]."""
        batch = len(self.rows)
        self._mask = torch.cat([self._mask, torch.ones(batch, 1, dtype=torch.long, device=self._device)], dim=1)
        output = self._model(
            input_ids=torch.tensor(list(input_ids), device=self._device).unsqueeze(1),
            position_ids=torch.tensor(self._positions, device=self._device).unsqueeze(1),
            attention_mask=self._mask,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._positions = [p + 1 for p in self._positions]
        return output.logits[:, -1]


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _pad_left(states: torch.Tensor, width: int) -> torch.Tensor:
    """Pad [B, heads, T, dim] with `width` zero positions before the first."""
    return F.pad(states, (0, 0, width, 0)) if width else states
