"""What the viewer knows about a run: one small row per rollout record and one dict per training step, kept up to
date by following the files as they grow.

A record file is read once, in large chunks; each whole line becomes a `Row` (the record's own place in the file
is kept, and the record is parsed in full only when someone opens it). A row is summarised without parsing the
token arrays: the recorder writes a record's fields in a fixed order (`RolloutRecord`), and the bytes
`],"usage":{` cannot occur inside a JSON string (its quotes would be escaped), so the head before `"samples"` and
the tail from `"usage"` are parsed apart and the samples are only counted. A line that does not fit that shape
(written by another writer, or an answer that holds the same bytes) is parsed in full: slower, never wrong.

`refresh()` reads what was appended since the last call (whole lines only: a line still being written is left for
the next call) and starts a file again from the top when it shrank (a new run in the same directory).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from interceptor.store.records import SCHEMA

__all__ = ["RecordIndex", "Row", "record_files"]

_CHUNK = 8 << 20
_HEAD_END = b',"samples":['
_SAMPLES_END = b'],"trace":['
_TAIL_START = b'],"usage":{'
_NOT_AUXILIARY = b'"auxiliary":false'
_AUXILIARY = b'"auxiliary":true'
_CHAINED = b'"chain":{'
_FORK_KINDS = (b'"kind":"fork"', b'"kind":"compaction"')  # a chain's kind: the only "kind" inside samples


@dataclass(slots=True)
class Row:
    """One rollout record, summarised. `file` and `offset` say where its line is."""

    file: int
    offset: int
    length: int
    rollout_id: str
    mode: str
    status: str
    cause: str | None
    reward: float | None
    task: str
    agent: str
    turns: int
    prompt_tokens: int
    completion_tokens: int
    samples: int
    auxiliary: int
    started_at: float
    finished_at: float | None
    chain_forks: int | None = None  # its fork and compaction chains; None for a record from before chains
    tampered: int = 0  # changes refused before grading (its `tampering` events)
    egress_refused: int = 0  # connections its box's egress proxy refused (its `limit_hit` events for "egress")

    @property
    def key(self) -> str:
        return f"{self.file}-{self.offset}"

    @property
    def forks(self) -> int:
        """Samples that rewrote the main conversation (as `RolloutRecord.forks`): sub-agents and side calls are not."""
        return self.chain_forks if self.chain_forks is not None else max(0, self.samples - self.auxiliary - 1)

    def to_json_dict(self) -> dict:
        return {
            "key": self.key, "rollout_id": self.rollout_id, "mode": self.mode, "status": self.status,
            "cause": self.cause, "reward": self.reward, "task": self.task, "agent": self.agent, "turns": self.turns,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "samples": self.samples, "forks": self.forks, "auxiliary": self.auxiliary,
            "started_at": self.started_at, "finished_at": self.finished_at, "tampered": self.tampered,
            "egress_refused": self.egress_refused,
        }


def record_files(target: Path) -> tuple[list[Path], Path | None]:
    """The record files and the metrics file of a run: `target` itself when it is a file, else the directory's
    `*.jsonl` files other than `metrics.jsonl`, and its `rollouts.jsonl` even before a run has written it (a
    fleet's per-node copies under `nodes/` are left out: the driver's file holds every record)."""
    if target.is_file():
        return [target], None
    if not target.is_dir():
        raise FileNotFoundError(f"{target} is neither a record file nor a run directory")
    files = {p for p in target.glob("*.jsonl") if p.name != "metrics.jsonl"} | {target / "rollouts.jsonl"}
    return sorted(files), target / "metrics.jsonl"


@dataclass(slots=True)
class _Followed:
    path: Path
    offset: int = 0  # where the next unread line starts
    inode: int | None = None


@dataclass
class RecordIndex:
    """Rows of every record file and the steps of the metrics file, following both as they grow."""

    files: list[Path]
    metrics: Path | None = None
    rows: list[Row] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    version: int = 0  # goes up whenever rows or steps change
    skipped: int = 0  # lines that were not records
    _followed: list[_Followed] = field(default_factory=list)
    _metrics: _Followed | None = None

    def __post_init__(self) -> None:
        self._followed = [_Followed(Path(p)) for p in self.files]
        self._metrics = _Followed(Path(self.metrics)) if self.metrics is not None else None

    @classmethod
    def open(cls, target: Path | str) -> RecordIndex:
        files, metrics = record_files(Path(target))
        index = cls(files=files, metrics=metrics)
        index.refresh()
        return index

    def refresh(self) -> bool:
        """Read what was appended since the last call; True when anything changed."""
        changed = False
        for number, followed in enumerate(self._followed):
            if _restarted(followed):
                self.rows = [row for row in self.rows if row.file != number]
                changed = True
            for offset, line in _new_lines(followed):
                row = summarise_line(number, offset, line)
                if row is None:
                    self.skipped += 1
                else:
                    self.rows.append(row)
                changed = True
        if self._metrics is not None:
            if _restarted(self._metrics):
                self.steps = []
                changed = True
            for _, line in _new_lines(self._metrics):
                try:
                    step = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(step, dict):
                    self.steps.append(step)
                    changed = True
        if changed:
            self.version += 1
        return changed

    def read_record(self, row: Row) -> dict:
        """The whole record of `row`, as written."""
        with open(self.files[row.file], "rb") as f:
            f.seek(row.offset)
            return orjson.loads(f.read(row.length))

    def find(self, key: str) -> Row | None:
        for row in reversed(self.rows):
            if row.key == key or row.rollout_id == key:
                return row
        return None


def _restarted(followed: _Followed) -> bool:
    """True when the file was replaced or cut shorter than what was read: read it again from the top."""
    try:
        stat = followed.path.stat()
    except FileNotFoundError:
        return False
    restarted = followed.offset > 0 and (stat.st_size < followed.offset or stat.st_ino != followed.inode)
    if restarted:
        followed.offset = 0
    followed.inode = stat.st_ino
    return restarted


def _new_lines(followed: _Followed):
    """(offset, line) for each whole line appended since the last read; a partial last line waits."""
    try:
        f = open(followed.path, "rb")
    except FileNotFoundError:
        return
    with f:
        f.seek(followed.offset)
        carry = b""
        start = followed.offset
        while chunk := f.read(_CHUNK):
            data = carry + chunk
            at = 0
            while (end := data.find(b"\n", at)) >= 0:
                line = data[at:end]
                if line.strip():
                    yield start + at, line
                at = end + 1
            start += at
            carry = data[at:]
        followed.offset = start
        followed.inode = os.fstat(f.fileno()).st_ino


def summarise_line(file: int, offset: int, line: bytes) -> Row | None:
    """The row of one record line, or None when the line is not a rollout record."""
    try:
        head_end = line.find(_HEAD_END)
        samples_end = line.find(_SAMPLES_END, head_end)
        tail_start = line.rfind(_TAIL_START)
        if min(head_end, samples_end, tail_start) < 0 or tail_start < samples_end:
            raise ValueError("not in the recorder's field order")
        head = orjson.loads(line[:head_end] + b"}")
        tail = orjson.loads(b"{" + line[tail_start + 2:])
        if tail.get("schema") != SCHEMA or "rollout_id" not in head:
            raise ValueError("not in the recorder's field order")
        section = line[head_end:samples_end]
        plain, auxiliary = section.count(_NOT_AUXILIARY), section.count(_AUXILIARY)
        forks = sum(section.count(kind) for kind in _FORK_KINDS) if _CHAINED in section else None
        return _row(file, offset, len(line), {**head, **tail}, samples=plain + auxiliary, auxiliary=auxiliary,
                    forks=forks)
    except (orjson.JSONDecodeError, ValueError):
        pass
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return None
    samples = [s for s in record.get("samples") or [] if isinstance(s, dict)]
    auxiliary = sum(bool(s.get("auxiliary")) for s in samples)
    chains = [s["chain"] for s in samples if isinstance(s.get("chain"), dict)]
    forks = sum(c.get("kind") in ("fork", "compaction") for c in chains) if chains else None
    return _row(file, offset, len(line), record, samples=len(samples), auxiliary=auxiliary, forks=forks)


def _row(file: int, offset: int, length: int, record: dict, *, samples: int, auxiliary: int,
         forks: int | None = None) -> Row:
    usage = record.get("usage") or {}
    metadata = record.get("metadata") or {}
    failure = record.get("failure") or None
    reward = record.get("reward")
    return Row(
        file=file, offset=offset, length=length,
        rollout_id=str(record.get("rollout_id")), mode=str(record.get("mode")), status=str(record.get("status")),
        cause=failure.get("cause") if isinstance(failure, dict) else None,
        reward=float(reward) if isinstance(reward, (int, float)) else None,
        task=str(metadata.get("task_id", "")), agent=str(metadata.get("agent", "")),
        turns=int(usage.get("turns", 0) or 0), prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
        completion_tokens=int(usage.get("completion_tokens", 0) or 0),
        samples=samples, auxiliary=auxiliary, chain_forks=forks,
        started_at=float(record.get("started_at") or 0.0),
        finished_at=float(record["finished_at"]) if record.get("finished_at") is not None else None,
        tampered=sum(int(event.get("total") or 0) for event in record.get("events") or ()
                     if isinstance(event, dict) and event.get("kind") == "tampering"),
        egress_refused=sum(int(event.get("count") or 0) for event in record.get("events") or ()
                           if isinstance(event, dict) and event.get("kind") == "limit_hit"
                           and event.get("limit") == "egress"),
    )
