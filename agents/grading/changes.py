"""What an agent changed in its workspace, as data: a manifest before and after, and the changes between them.

    before = manifest(box.workspace)          # right after the task's set-up
    ...the agent runs...
    changed = changes(before, manifest(box.workspace))
    carried = carry(changed, box.workspace)   # the bytes, modes and link targets, read before the box is gone
    apply(carried, fresh.workspace)           # onto a fresh box's clean copy of the task

A manifest maps each path under the root (relative, `/`-separated; links never followed) to its kind, mode and
content digest (a file's SHA-256, a link's target). Special files (FIFOs, sockets, devices) are entries of kind
`special`: a change to one is carried as refused data, never applied.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Carried", "Change", "Entry", "apply", "carry", "changes", "manifest"]

Kind = Literal["file", "dir", "link", "special"]


@dataclass(frozen=True, slots=True)
class Entry:
    kind: Kind
    mode: int  # the permission bits
    digest: str = ""  # a file's SHA-256, a link's target


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    what: Literal["added", "modified", "deleted"]
    entry: Entry | None  # what is there now (None: deleted)
    before: Entry | None = None


@dataclass(frozen=True, slots=True)
class Carried:
    """A change with what applying it needs: a file's bytes (None for anything else)."""

    change: Change
    data: bytes | None = None


def manifest(root: Path) -> dict[str, Entry]:
    found: dict[str, Entry] = {}
    for directory, dirs, files in os.walk(root, followlinks=False):
        base = Path(directory)
        for name in (*dirs, *files):
            path = base / name
            relative = path.relative_to(root).as_posix()
            info = path.lstat()
            found[relative] = _entry(path, info)
    return found


def _entry(path: Path, info: os.stat_result) -> Entry:
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return Entry("link", mode, os.readlink(path))
    if stat.S_ISDIR(info.st_mode):
        return Entry("dir", mode)
    if stat.S_ISREG(info.st_mode):
        digest = hashlib.sha256()
        with open(path, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        return Entry("file", mode, digest.hexdigest())
    return Entry("special", mode)


def changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[Change]:
    """Every path added, modified (kind, mode or content) or deleted, in path order; a deleted directory's own
    entries are listed too."""
    found = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        what = "added" if old is None else "deleted" if new is None else "modified"
        found.append(Change(path, what, new, old))
    return found


def carry(changed: list[Change], root: Path) -> list[Carried]:
    """Read what applying `changed` elsewhere needs from `root` (a file's bytes), now."""
    carried = []
    for change in changed:
        data = None
        if change.entry is not None and change.entry.kind == "file":
            with open(os.path.join(root, change.path), "rb", opener=_no_follow) as file:
                data = file.read()
        carried.append(Carried(change, data))
    return carried


def apply(carried: list[Carried], root: Path) -> None:
    """Make these changes under `root` (a fresh copy of the task's workspace): deletions first (deepest first), then
    directories, files and links in path order. Nothing is written through a link."""
    for item in sorted((c for c in carried if c.change.entry is None), key=lambda c: c.change.path, reverse=True):
        target = root / item.change.path
        if target.is_dir() and not target.is_symlink():
            if not any(target.iterdir()):
                target.rmdir()
        else:
            target.unlink(missing_ok=True)
    for item in carried:
        entry = item.change.entry
        if entry is None:
            continue
        target = root / item.change.path
        if _replaced_kind(target, entry.kind):
            if target.is_dir() and not target.is_symlink():
                target.rmdir()  # its entries were deleted above
            else:
                target.unlink()
        if entry.kind == "dir":
            target.mkdir(mode=entry.mode, exist_ok=True)
            os.chmod(target, entry.mode)
        elif entry.kind == "link":
            target.symlink_to(entry.digest)
        elif entry.kind == "file":
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, entry.mode)
            with os.fdopen(fd, "wb") as file:
                os.fchmod(file.fileno(), entry.mode)
                file.write(item.data or b"")


def _replaced_kind(target: Path, kind: Kind) -> bool:
    """A file or link where something of another kind (or a link) goes: removed first."""
    if not (target.exists() or target.is_symlink()):
        return False
    if target.is_symlink():
        return True
    return (target.is_dir() and kind != "dir") or (not target.is_dir() and kind == "dir")


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)
