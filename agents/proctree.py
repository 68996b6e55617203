"""Process trees: find every process an agent started, and end them all.

A process group is not enough to hold an agent: Pi and OpenCode start their shell tool's commands detached (a new
session, so a new group), and a command that backgrounds something (`server &`) leaves an orphan that the kernel
hands to init, outside any tree we could walk. So on Linux the sandbox starts the agent under this module run as a
script, a small *subreaper*:

    python -I agents/proctree.py --grace 3 -- pi --provider ...

It marks itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so orphans of any descendant are re-parented to it
instead of init and stay in its tree; it starts the agent as its child; when the agent exits, or when it receives
SIGTERM/SIGINT/SIGHUP, it ends every remaining descendant (SIGTERM, `--grace` seconds, then SIGKILL, repeated until
none is left, since a dying process may still fork), reaps them, and exits with the agent's status (128+N when signal
N ended the agent, as shells report it). A failure to start the agent exits 127 with a line on stderr.

The functions below are also what the sandbox uses when it must end a tree itself (cancellation, a wedged shim).
Stdlib only: this file runs as a plain script, without the package on sys.path.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable

__all__ = ["descendants", "end_tree", "kill_tree", "main", "supports_subreaper"]

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_KILL_ROUNDS = 50  # SIGKILL sweeps before giving up on a process that keeps forking
_EXEC_FAILED = 127  # what shells return for a command that could not be run


def supports_subreaper() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def _parents() -> dict[int, int]:
    """pid -> parent pid for every live (non-zombie) process, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:  # it exited while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields and fields[0] != b"Z":
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(root: int) -> list[int]:
    """Live descendants of `root`, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            found.append(child)
            frontier.append(child)
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(root: int, *, include_root: bool) -> None:
    """SIGKILL every descendant of `root` (and `root`), sweeping until none is left. Synchronous: safe to call
    while a coroutine is being cancelled."""
    for _ in range(_KILL_ROUNDS):
        pids = descendants(root)
        if not pids:
            break
        _signal(pids, signal.SIGKILL)
        time.sleep(0.01)  # let the kernel finish them before looking again
    if include_root:
        _signal([root], signal.SIGKILL)


def end_tree(root: int, *, grace_s: float, reap: Callable[[], None]) -> None:
    """SIGTERM every descendant of `root`, wait up to `grace_s` for them to go, then SIGKILL what is left.
    `reap()` is called while waiting (the shim reaps its children there; others pass a no-op)."""
    pids = descendants(root)
    if pids:
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while descendants(root) and time.monotonic() < deadline:
            reap()
            time.sleep(0.05)
    kill_tree(root, include_root=False)
    reap()


# ------------------------------------------------------------------------------------------ the shim


def _reap_all() -> dict[int, int]:
    statuses: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return statuses
        if pid == 0:
            return statuses
        statuses[pid] = status


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run a command as a child subreaper and end its whole tree")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"proctree: prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)

    watched = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    # Blocked before the fork so no signal is lost between the fork and the wait; the child unblocks them.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    error_read, error_write = os.pipe()  # close-on-exec: EOF means exec succeeded
    child = os.fork()
    if child == 0:
        os.close(error_read)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(error_write, f"cannot run {command[0]}: {exc.strerror or exc}".encode())
        os._exit(_EXEC_FAILED)
    os.close(error_write)
    with os.fdopen(error_read, "rb") as pipe:
        exec_error = pipe.read().decode(errors="replace")
    if exec_error:
        print(f"proctree: {exec_error}", file=sys.stderr)
        os.waitpid(child, 0)
        return _EXEC_FAILED

    statuses: dict[int, int] = {}

    def reap() -> None:
        statuses.update(_reap_all())

    stopped_by: int | None = None
    while child not in statuses:
        info = signal.sigwaitinfo(watched)
        if info.si_signo == signal.SIGCHLD:
            reap()
        else:
            stopped_by = info.si_signo
            break
    # The agent exited, or we were asked to stop: end whatever is left (background jobs, detached tool commands).
    end_tree(os.getpid(), grace_s=args.grace, reap=reap)
    if child not in statuses:
        try:
            statuses[child] = os.waitpid(child, 0)[1]
        except ChildProcessError:
            pass
    status = statuses.get(child)
    return _exit_code(status) if status is not None else 128 + (stopped_by or signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
