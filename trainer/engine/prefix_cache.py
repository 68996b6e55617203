"""Prefix caching (vLLM's automatic prefix caching, in the small): the keys and values of recent prompts, kept so
that a prompt that starts with one is prefilled from where they end.

An agent's next turn is its previous prompt, the reply and a tool result: with a 6k-14k-token agent prompt, the
whole of it used to be prefilled again every turn. Entries are the prompts' caches as prefilled (tensors that are
never written in place: decoding appends by making new ones), bounded in bytes, least recently used out first, and
dropped whenever the weights change. A prompt reuses the longest prefix it shares with an entry, at least
`min_tokens` long and one token short of the prompt at most (the last position's hidden state samples the first
token). Prompts that ask for prompt logprobs are prefilled whole: every position's hidden state is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from transformers import DynamicCache

__all__ = ["PrefixCache"]


class _Entry:
    __slots__ = ("ids", "layers", "nbytes")

    def __init__(self, ids: list[int], cache: DynamicCache) -> None:
        self.ids = ids
        self.layers = [(layer.keys, layer.values) for layer in cache.layers]
        self.nbytes = sum(k.nbytes + v.nbytes for k, v in self.layers)


class PrefixCache:
    def __init__(self, budget_bytes: int, *, min_tokens: int = 64) -> None:
        self.budget_bytes = budget_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._bytes = 0
        self._serial = 0
        self.hits = 0  # prompts prefilled from a cached prefix
        self.reused_tokens = 0  # prompt tokens not computed again

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> tuple[int, DynamicCache] | None:
        """The longest usable cached prefix of `ids`: its length and a fresh cache holding it, or None."""
        best, best_len = None, 0
        for key, entry in self._entries.items():
            shared = _shared_prefix(entry.ids, ids)
            if shared > best_len:
                best, best_len = key, shared
        length = min(best_len, len(ids) - 1)
        if best is None or length < self.min_tokens:
            return None
        self._entries.move_to_end(best)
        self.hits += 1
        self.reused_tokens += length
        layers = self._entries[best].layers
        return length, DynamicCache(ddp_cache_data=[(k[:, :, :length], v[:, :, :length]) for k, v in layers])

    def add(self, ids: Sequence[int], cache: DynamicCache) -> None:
        """Keep the cache of a prompt just prefilled (its whole length), evicting the oldest past the budget."""
        if self.budget_bytes <= 0 or len(ids) < self.min_tokens:
            return
        entry = _Entry(list(ids), cache)
        if entry.nbytes > self.budget_bytes:
            return
        for key in [k for k, old in self._entries.items() if _shared_prefix(old.ids, entry.ids) == len(old.ids)]:
            self._bytes -= self._entries.pop(key).nbytes  # a prefix of this prompt: everything it offers, this does
        self._serial += 1
        self._entries[self._serial] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.budget_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


def _shared_prefix(a: list[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share (slices compared in C, halving the range)."""
    n = min(len(a), len(b))
    if a[:n] == list(b[:n]):
        return n
    low, high = 0, n  # a[:low] == b[:low]; a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == list(b[low:mid]):
            low = mid
        else:
            high = mid
    return low
