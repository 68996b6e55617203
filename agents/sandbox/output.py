"""The kept part of an agent's stdout or stderr: the last N bytes, with the rollout's secrets replaced by `***`.

An agent can print for hours; a rollout keeps only the tail (errors are at the end). Secrets are replaced on the
whole buffer before any cut, so a secret split by a chunk boundary or by the cut itself is never left half-visible.
"""

from __future__ import annotations

__all__ = ["OutputTail"]

MASK = b"***"


class OutputTail:
    def __init__(self, *, limit_bytes: int, secrets: tuple[str, ...] = ()) -> None:
        if limit_bytes < 1:
            raise ValueError("limit_bytes must be positive")
        self.limit = limit_bytes
        self.dropped = 0  # bytes cut from the head
        self._secrets = tuple(s.encode() for s in secrets if s)
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        if len(self._buffer) > 2 * self.limit:  # cut at most once per `limit` bytes: O(1) per byte overall
            self._cut()

    def text(self) -> str:
        self._cut()
        return self._buffer.decode(errors="replace")

    def _cut(self) -> None:
        # A secret still arriving sits at the tail, never at the cut; every complete one is masked first.
        scrubbed = bytes(self._buffer)
        for secret in self._secrets:
            scrubbed = scrubbed.replace(secret, MASK)
        excess = max(0, len(scrubbed) - self.limit)
        self.dropped += excess
        self._buffer = bytearray(scrubbed[excess:])
