"""The ids of long pieces of rendered text, remembered across rollouts.

A long text (a first turn, a fork) is encoded as chunks cut right after each end-of-turn token (`Renderer.encode`):
the chunks give the ids the whole text gives, since special tokens are split off before BPE. Every rollout of an
agent starts with the same system prompt and tool list (Claude Code's render to ~12k tokens), and the G rollouts
of a GRPO group with the same task, so the same chunks come back again and again. `ChunkIds` keeps the ids of
chunks of at least `min_chars` characters by the digest of their text (`digests.py`), bounded by the total ids it
holds (least recently used first out), and encodes only the chunks it has not seen, in one batch call that
releases the GIL. Thread-safe: long texts are encoded in worker threads.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

from .digests import digest

__all__ = ["ChunkIds"]


class ChunkIds:
    def __init__(self, *, max_ids: int = 2_000_000, min_chars: int = 2048) -> None:
        self._max_ids = max_ids
        self.min_chars = min_chars  # shorter chunks are encoded each time
        self._kept: OrderedDict[bytes, array] = OrderedDict()
        self._kept_ids = 0
        self._lock = threading.Lock()
        self.hits = 0  # chunks answered from memory
        self.misses = 0  # chunks encoded

    def encode(self, chunks: Sequence[str], encode_batch: Callable[[list[str]], list[list[int]]]) -> list[int]:
        """The ids of the concatenation of `chunks`; `encode_batch` encodes the ones not kept."""
        keys = [digest(c.encode("utf-8", "surrogatepass")) if len(c) >= self.min_chars else None for c in chunks]
        found: list[array | None] = [None] * len(chunks)
        with self._lock:
            for i, key in enumerate(keys):
                if key is not None and (kept := self._kept.get(key)) is not None:
                    self._kept.move_to_end(key)
                    found[i] = kept
        missing = [i for i, ids in enumerate(found) if ids is None]
        encoded = encode_batch([chunks[i] for i in missing]) if missing else []
        with self._lock:
            self.hits += len(chunks) - len(missing)
            self.misses += len(missing)
            for i, ids in zip(missing, encoded, strict=True):
                found[i] = ids
                if keys[i] is not None and keys[i] not in self._kept and len(ids) <= self._max_ids:
                    self._kept[keys[i]] = array("i", ids)
                    self._kept_ids += len(ids)
            while self._kept_ids > self._max_ids:
                _, dropped = self._kept.popitem(last=False)
                self._kept_ids -= len(dropped)
        out: list[int] = []
        for ids in found:
            out.extend(ids)
        return out
