"""The ids of long pieces of rendered text, remembered across rollouts.

A long text (a first turn, a fork) is encoded as chunks cut right after each end-of-turn token (`Renderer.encode`):
the chunks give the ids the whole text gives, since special tokens are split off before BPE. Every rollout of an
agent starts with the same system prompt and tool list (Claude Code's render to ~12k tokens), and the G rollouts
of a GRPO group with the same task, so the same chunks come back again and again. `ChunkIds` keeps the ids of
chunks of at least `min_chars` characters by the digest of their text (`digests.py`), bounded by the total ids it
holds (least recently used first out), and encodes only the chunks it has not seen, in one batch call that
releases the GIL (a stretch of ~256 KB of text per call, so a 10 MB conversation never holds all its ids as Python
ints at once). Thread-safe: long texts are encoded in worker threads.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

import orjson

from interceptor.digests import digest
from interceptor.tokens.ids_json import IdsJson

__all__ = ["ChunkIds", "cut_after"]

_BATCH_CHARS = 256 * 1024  # text per batch call: work for the tokenizer's threads, and ~60k ids alive at most


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
        out: list[int] = []
        for ids in self._each(chunks, encode_batch):
            out.extend(ids)
        return out

    def encode_json(self, chunks: Sequence[str], encode_batch: Callable[[list[str]], list[list[int]]]) -> IdsJson:
        """`encode`'s ids as JSON, made chunk by chunk: no list of every id is built (`ids_json.py`)."""
        parts, count = [], 0
        for ids in self._each(chunks, encode_batch):
            if len(ids):
                parts.append(orjson.dumps(ids if isinstance(ids, list) else ids.tolist())[1:-1])
                count += len(ids)
        return IdsJson(b"[" + b",".join(parts) + b"]", count)

    def _each(self, chunks: Sequence[str],
              encode_batch: Callable[[list[str]], list[list[int]]]) -> Iterator[Sequence[int]]:
        """Each chunk's ids, in order: kept ones from memory, the others encoded a stretch of about `_BATCH_CHARS`
        at a time (one batch call each, so only that stretch's ids are alive at once)."""
        keys = [digest(c.encode("utf-8", "surrogatepass")) if len(c) >= self.min_chars else None for c in chunks]
        i = 0
        while i < len(chunks):
            start, found, missing, chars = i, [], [], 0
            with self._lock:
                while i < len(chunks) and chars < _BATCH_CHARS:
                    key = keys[i]
                    kept = self._kept.get(key) if key is not None else None
                    if kept is not None:
                        self._kept.move_to_end(key)
                    else:
                        missing.append(i - start)
                        chars += len(chunks[i])
                    found.append(kept)
                    i += 1
            encoded = encode_batch([chunks[start + j] for j in missing]) if missing else []
            with self._lock:
                self.hits += len(found) - len(missing)
                self.misses += len(missing)
                for j, ids in zip(missing, encoded, strict=True):
                    found[j] = ids
                    key = keys[start + j]
                    if key is not None and key not in self._kept and len(ids) <= self._max_ids:
                        self._kept[key] = array("i", ids)
                        self._kept_ids += len(ids)
                while self._kept_ids > self._max_ids:
                    _, dropped = self._kept.popitem(last=False)
                    self._kept_ids -= len(dropped)
            del encoded
            yield from found


def cut_after(text: str, marker: str) -> list[str]:
    """`text` cut right after each occurrence of `marker` (the pieces join back to `text`)."""
    pieces, start = [], 0
    while (end := text.find(marker, start)) >= 0:
        end += len(marker)
        pieces.append(text[start:end])
        start = end
    if start < len(text):
        pieces.append(text[start:])
    return pieces
