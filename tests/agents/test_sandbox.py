"""The local sandbox with real processes: limits, the idle watchdog, how a run ended, the whole process tree ending
with it, bounded and scrubbed output, and the per-rollout directories."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from agents import AgentLaunch, Heartbeat, LocalSandbox, LocalSandboxConfig, RunLimits
from agents.sandbox.output import OutputTail

SECRET = "tok-9f8e7d6c5b4a"
FAST = LocalSandboxConfig(kill_grace_s=0.5, poll_s=0.05)


def shell(box: LocalSandbox, script: str, *, stdin: bytes | None = None, env: dict | None = None) -> AgentLaunch:
    return AgentLaunch(
        argv=("sh", "-c", script),
        env={"HOME": str(box.home), "TOKEN": SECRET, **(env or {})},
        cwd=box.workspace,
        stdin=stdin,
        secrets=(SECRET,),
    )


def alive(pid: int) -> bool:
    """True while `pid` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


async def wait_for_file(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


# A shell that starts three kinds of descendants and writes their pids: a plain background child (same group), a
# detached one (its own session, as Pi and OpenCode run tool commands), and an orphan (its parent exits at once).
SPAWN_TREE = (
    "sleep 301 & echo $! >> pids; "
    "setsid sleep 302 & echo $! >> pids; "
    "sh -c 'setsid sleep 303 & echo $! >> pids' ; "
    "echo done >> ready; "
)


async def test_timeout_ends_the_whole_tree_detached_and_orphaned_children_included(tmp_path):
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, SPAWN_TREE + "sleep 300"), limits=RunLimits(wall_s=1.0, idle_s=None))
        pids = [int(line) for line in (box.workspace / "pids").read_text().split()]
    assert result.outcome == "timeout" and result.exit_code is None
    assert "1 s wall-clock limit" in result.reason
    assert len(pids) == 3 and not any(alive(pid) for pid in pids)


async def test_what_an_agent_leaves_running_ends_when_it_exits(tmp_path):
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, SPAWN_TREE + "exit 0"), limits=RunLimits(wall_s=10, idle_s=None))
        pids = [int(line) for line in (box.workspace / "pids").read_text().split()]
    assert result.ok
    assert not any(alive(pid) for pid in pids)


async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period():
    config = LocalSandboxConfig(kill_grace_s=0.5, poll_s=0.05)
    async with LocalSandbox(config) as box:
        result = await box.run(shell(box, "trap '' TERM; sleep 300 & wait"), limits=RunLimits(wall_s=0.5, idle_s=None))
    assert result.outcome == "timeout"
    assert result.seconds >= 0.9  # the wall limit, then the grace, then SIGKILL (an upper bound is for bench/)


async def test_idle_watchdog_ends_an_agent_that_neither_prints_nor_is_heard_from():
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, "sleep 300"), limits=RunLimits(wall_s=30, idle_s=0.5))
    assert result.outcome == "idle"
    assert "0.5 s" in result.reason


async def test_output_keeps_an_agent_from_being_idle():
    script = "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.15; done"
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, script), limits=RunLimits(wall_s=30, idle_s=0.5))
    assert result.ok and "tick 8" in result.stdout


async def test_outside_activity_keeps_a_silent_agent_from_being_idle():
    heartbeat = Heartbeat()

    async def server_sees_requests() -> None:
        while True:
            heartbeat.beat()
            await asyncio.sleep(0.1)

    async with LocalSandbox(FAST) as box:
        beating = asyncio.create_task(server_sees_requests())
        try:
            result = await box.run(shell(box, "sleep 1.2"), limits=RunLimits(wall_s=30, idle_s=0.5), activity=heartbeat)
        finally:
            beating.cancel()
    assert result.ok


@pytest.mark.parametrize(("script", "code"), [("exit 3", 3), ("kill -9 $$", 128 + 9), ("echo fine", 0)])
async def test_exit_status_is_reported(script, code):
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, script), limits=RunLimits(wall_s=10))
    assert result.outcome == "exited" and result.exit_code == code
    assert result.ok == (code == 0)


async def test_a_missing_program_is_a_spawn_failure_with_the_reason():
    async with LocalSandbox(FAST) as box:
        launch = AgentLaunch(argv=("/nonexistent/agent", "-p"), env={}, cwd=box.workspace)
        result = await box.run(launch, limits=RunLimits(wall_s=10))
    assert result.outcome == "spawn_failed" and "/nonexistent/agent" in result.reason


async def test_a_missing_working_directory_is_a_spawn_failure():
    async with LocalSandbox(FAST) as box:
        launch = AgentLaunch(argv=("true",), env={}, cwd=box.workspace / "gone")
        result = await box.run(launch, limits=RunLimits(wall_s=10))
    assert result.outcome == "spawn_failed" and "No such file" in result.reason


async def test_stop_event_ends_the_run_as_cancelled_and_ends_the_tree():
    stop = asyncio.Event()
    async with LocalSandbox(FAST) as box:
        run = asyncio.create_task(box.run(shell(box, SPAWN_TREE + "sleep 300"), limits=RunLimits(), stop=stop))
        await wait_for_file(box.workspace / "ready")
        stop.set()
        result = await run
        pids = [int(line) for line in (box.workspace / "pids").read_text().split()]
    assert result.outcome == "cancelled"
    assert not any(alive(pid) for pid in pids)


async def test_cancelling_run_kills_the_tree_and_the_cancellation_propagates():
    async with LocalSandbox(FAST) as box:
        run = asyncio.create_task(box.run(shell(box, SPAWN_TREE + "sleep 300"), limits=RunLimits()))
        await wait_for_file(box.workspace / "ready")
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        pids = [int(line) for line in (box.workspace / "pids").read_text().split()]
    assert not any(alive(pid) for pid in pids)


async def test_output_is_a_bounded_tail_with_the_secret_replaced():
    config = LocalSandboxConfig(output_limit_bytes=4096, poll_s=0.05)
    # ~97 KB of noise with the secret in the middle and at the end, on both streams
    script = (
        'echo "early $TOKEN"; i=0; while [ $i -lt 2000 ]; do echo "line $i ......................................"; '
        'i=$((i+1)); done; echo "key=$TOKEN"; echo "err $TOKEN" >&2; echo last'
    )
    async with LocalSandbox(config) as box:
        result = await box.run(shell(box, script), limits=RunLimits(wall_s=30))
    assert result.ok
    assert len(result.stdout.encode()) <= 4096 and result.stdout_dropped > 90_000
    assert result.stdout.endswith("key=***\nlast\n") and "early" not in result.stdout
    assert SECRET not in result.stdout and SECRET not in result.stderr
    assert result.stderr == "err ***\n"


def test_a_secret_split_across_chunks_or_by_the_cut_never_shows():
    tail = OutputTail(limit_bytes=16, secrets=(SECRET,))  # a limit as long as the secret: the tightest case
    for byte in b"a" * 10 + SECRET.encode() + b"b" * 7 + SECRET.encode() + b"ccc":
        tail.feed(bytes([byte]))  # one byte at a time: the secret arrives split at every point
        tail.text()  # and reading cuts the buffer at every point too
    text = tail.text()
    assert text.endswith("***ccc") and "***bbbbbbb***ccc".endswith(text)
    assert tail.dropped > 0


async def test_the_instruction_reaches_stdin_whole():
    instruction = ("-x @file \"quoted\" {model}\n" * 5000).encode()  # ~150 KB: more than a pipe buffer
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, "cat > got.txt", stdin=instruction), limits=RunLimits(wall_s=30))
        assert result.ok and (box.workspace / "got.txt").read_bytes() == instruction


async def test_an_agent_that_ignores_its_stdin_is_not_an_error():
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, "exit 0", stdin=b"x" * 1_000_000), limits=RunLimits(wall_s=30))
    assert result.ok


async def test_only_the_passthrough_variables_of_the_host_reach_the_agent(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "host-provider-key")
    monkeypatch.setenv("HF_TOKEN", "host-hf-token")
    async with LocalSandbox(FAST) as box:
        result = await box.run(shell(box, "env > env.txt"), limits=RunLimits(wall_s=10))
        env = dict(line.split("=", 1) for line in (box.workspace / "env.txt").read_text().splitlines() if "=" in line)
        assert result.ok
        assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env
        assert env["TMPDIR"] == str(box.tmp) and env["HOME"] == str(box.home)
        assert env["PATH"].split(os.pathsep)[0] == str(box.bin_dir)
        assert env["PATH"].endswith(os.environ["PATH"])


async def test_commands_in_bin_dir_come_first_on_path():
    async with LocalSandbox(FAST) as box:
        command = box.bin_dir / "answer"
        command.write_text("#!/bin/sh\necho answered \"$@\"\n")
        command.chmod(0o755)
        result = await box.run(shell(box, "answer 42"), limits=RunLimits(wall_s=10))
    assert result.stdout == "answered 42\n"


async def test_directories_are_private_and_removed_on_exit_even_when_made_read_only():
    async with LocalSandbox(FAST) as box:
        root = box.root
        assert (root.stat().st_mode & 0o077) == 0
        locked = box.workspace / "locked"
        result = await box.run(
            shell(box, "mkdir -p locked/deep && touch locked/deep/f && chmod 000 locked/deep locked"),
            limits=RunLimits(wall_s=10),
        )
        assert result.ok and locked.exists()
    assert not root.exists()


async def test_keep_dirs_leaves_them_for_debugging(tmp_path):
    async with LocalSandbox(LocalSandboxConfig(parent_dir=tmp_path, keep_dirs=True)) as box:
        root = box.root
    assert root.exists() and root.parent == tmp_path.resolve()
