"""Process trees: find every process an agent started, and end them all.

A process group is not enough to hold an agent: Pi and OpenCode start their shell tool's commands detached (a new
session, so a new group), and a command that backgrounds something (`server &`) leaves an orphan that the kernel
hands to init, outside any tree we could walk. So on Linux the sandbox starts the agent under this module run as a
script, a small *subreaper*:

    python -I agents/sandbox/proctree.py --grace 3 -- pi --provider ...

It marks itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so orphans of any descendant are re-parented to it
instead of init and stay in its tree; it starts the agent as its child; when the agent exits, or when it receives
SIGTERM/SIGINT/SIGHUP, it ends every remaining descendant (SIGTERM, `--grace` seconds, then SIGKILL, repeated until
none is left, since a dying process may still fork), reaps them, and exits with the agent's status (128+N when signal
N ended the agent, as shells report it). A failure to start the agent exits 127 with a line on stderr.

With `--launch-stdin` instead of a command, the shim is started *before* its agent is known (a warm sandbox: its
namespaces, container and network bridge already up) and waits for one launch on stdin: a decimal byte count, a
newline, then that many bytes of JSON `{"argv", "env", "cwd", "stdin"}` (`launch_header` writes it). The agent runs
with exactly `env` as its environment (not the shim's: Python adds LC_CTYPE to its own in a C locale; only the
variables named in `inherit` are kept from it), in `cwd`,
with the rest of stdin as its own stdin when `stdin` is true and /dev/null otherwise. EOF before a launch (the
sandbox was put away unused) exits 0. Before it waits, it writes one byte, READY, to stdout: the sandbox reads it,
so a spare is known to be fully up (namespaces, bridge, interpreter) before a run is handed to it.

The functions below are also what the sandbox uses when it must end a tree itself (cancellation, a wedged shim).
Stdlib only: this file runs as a plain script, without the package on sys.path.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Callable

__all__ = ["descendants", "end_tree", "kill_tree", "launch_header", "main", "supports_subreaper"]

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_KILL_ROUNDS = 50  # SIGKILL sweeps before giving up on a process that keeps forking
_EXEC_FAILED = 127  # what shells return for a command that could not be run
_HEADER_LIMIT = 16 * 1024 * 1024  # bytes of a launch header (argv and environment)
READY = b"\x06"  # what a --launch-stdin shim writes to stdout once it waits for its launch


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


def launch_header(
    argv: list[str], env: dict[str, str], cwd: str, *, stdin: bool, inherit: tuple[str, ...] = ()
) -> bytes:
    """What a `--launch-stdin` shim reads before it starts its agent. `inherit`: variables kept from the shim's
    own environment where `env` does not set them (a container's HOME, which its runtime sets per user)."""
    body = json.dumps({"argv": argv, "env": env, "cwd": cwd, "stdin": stdin, "inherit": list(inherit)}).encode()
    return b"%d\n" % len(body) + body


def _read_launch() -> dict | None:
    """The launch a warm shim waits for on fd 0, read unbuffered so the agent's own stdin stays in the pipe."""
    digits = b""
    while not digits.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            return None
        digits += byte
        if len(digits) > 12:
            raise ValueError("bad launch header")
    size = int(digits)
    if not 0 < size <= _HEADER_LIMIT:
        raise ValueError(f"bad launch header size {size}")
    body = b""
    while len(body) < size:
        chunk = os.read(0, size - len(body))
        if not chunk:
            raise ValueError("the launch header was cut short")
        body += chunk
    launch = json.loads(body)
    if not (isinstance(launch.get("argv"), list) and launch["argv"] and isinstance(launch.get("env"), dict)):
        raise ValueError("a launch needs argv and env")
    return launch


def _await_launch() -> list[str] | None:
    """Wait for the launch, then take on its directory, environment and stdin; its argv, or None on EOF."""
    os.write(1, READY)
    launch = _read_launch()
    if launch is None:
        return None
    os.chdir(launch.get("cwd") or ".")
    kept = {key: os.environ[key] for key in launch.get("inherit") or () if key in os.environ}
    os.environ.clear()
    os.environ.update({**kept, **{str(k): str(v) for k, v in launch["env"].items()}})
    if not launch.get("stdin"):
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    return [str(arg) for arg in launch["argv"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run a command as a child subreaper and end its whole tree")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--launch-stdin", action="store_true", help="read the command from stdin (a warm sandbox)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.launch_stdin:
        if command:
            parser.error("--launch-stdin takes no command")
        try:
            launched = _await_launch()
        except (OSError, ValueError) as exc:
            print(f"proctree: {exc}", file=sys.stderr)
            return _EXEC_FAILED
        if launched is None:
            return 0
        command = launched
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
