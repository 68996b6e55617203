"""One server per record file: an exclusive lock on `R.lock`, beside the record file `R`.

A server that writes `R` also owns its journal (`R.journal.*`) and recovers it at start-up, deleting the segments
it recovered; a second server on the same file would recover the first one's live rollouts as `interrupted` and
delete the segment the first is writing. So the server takes this lock before it touches `R` or its journal, and
holds it for its whole life: `hold_record_file` takes it without waiting and refuses with a `ConfigError` that
names the file and the holder's pid (written into the lock file). The lock is an `flock`, which the kernel drops
when its holder's descriptor closes, so a server killed with kill -9 leaves nothing to clean up. `--workers N`
takes N locks, one per worker's own file (`workers.worker_record_path`).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from interceptor.errors import ConfigError

__all__ = ["RecordLock", "hold_record_file", "lock_path"]


def lock_path(record_path: Path) -> Path:
    return record_path.with_name(record_path.name + ".lock")


class RecordLock:
    """The held lock on one record file; `release` drops it (closing the descriptor does)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        # The file stays: unlinking it would let the next server lock a new inode while a third still holds the
        # old one under the same name.
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def hold_record_file(record_path: Path) -> RecordLock:
    """Lock `record_path` for this process, or raise `ConfigError` if another server writes it."""
    record_path = Path(record_path)
    path = lock_path(record_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not inheritable (os.open's default): an agent or tool this process starts must not keep the lock after it.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise ConfigError(
            f"another server ({holder}) is writing the record file {record_path}; two servers on one record file "
            f"would recover each other's live rollouts; give this server its own record file, or stop the other"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message a refused server shows
    return RecordLock(path, fd)


def _holder(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return f"pid {text}" if text.isdigit() else "pid unknown"
