"""Durable JSON Lines storage of finished rollouts.

`Recorder.write` appends one rollout as one line and fsyncs before it returns, so a rollout reported finished is
on disk; a crash loses at most turns still in flight. Writes run in a worker thread (fsync blocks) and are
serialised so lines never interleave. `read_records` reads a file back into the same types.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import orjson

from .records import RolloutRecord

__all__ = ["Recorder", "read_records"]


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = asyncio.Lock()

    async def write(self, record: RolloutRecord) -> None:
        line = orjson.dumps(record.to_json_dict(), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        async with self._lock:
            await asyncio.to_thread(self._append, line)

    def _append(self, line: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def read_records(path: Path | str) -> Iterator[RolloutRecord]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield RolloutRecord.from_json_dict(orjson.loads(line))
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: not a rollout record: {exc}") from exc
