"""RemoteDockerSandbox: a box that shares no file system with the host, as a daemon on another machine would run it.

Files go in and out through the daemon (`docker cp`), the agent's programs come in an image made from the task's,
and the model endpoint is carried over a `docker exec` pipe. What is judged: the daemon's own account of the run's
container (no bind mount at all), the host's copy of the workspace (unchanged until it is pulled), the model server's
log, a listener's connections, and the daemon's container and volume lists after the box is closed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agents import AgentLaunch, PiAgent, RunLimits
from agents.runner import Runner, RunnerConfig
from agents.sandbox.docker import LABEL
from agents.sandbox.docker.remote import RemoteDockerSandbox
from agents.specs.packages import PI
from agents.specs.spec import BoxFile
from agents.tasks import Grader, Task
from tests.agents.agent_runs import MAX_MODEL_LEN, bash_call, require_agent
from tests.invariants import assert_token_exact

from .test_docker_sandbox import (
    BOUND_S,
    FAST,
    IMAGE,
    WHY_NOT,
    containers,
    long_sleep,
    sleeping,
)
from .test_isolation import wait_until
from .test_swe import server  # noqa: F401  (fixture: a server on port 0 in front of the scripted upstream)

pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"docker sandbox: {WHY_NOT}")


def sandbox(endpoint: tuple[str, int] | None = None, **kwargs) -> RemoteDockerSandbox:
    return RemoteDockerSandbox(FAST, image=IMAGE, endpoint=endpoint, **kwargs)


def volumes() -> set[str]:
    listed = subprocess.run(["docker", "volume", "ls", "--filter", f"label={LABEL}", "--format", "{{.Name}}"],
                            capture_output=True, text=True, timeout=20, check=True)  # fmt: skip
    return set(listed.stdout.split())


def mounts_of(name: str) -> list[dict]:
    done = subprocess.run(["docker", "inspect", "--format", "{{json .Mounts}}", name], capture_output=True, text=True,
                          timeout=20, check=True)  # fmt: skip
    return json.loads(done.stdout)


async def test_files_go_in_and_out_through_the_daemon_and_the_run_has_no_bind_mount():
    seconds = long_sleep()
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        await box.put_files((BoxFile(box.workspace / "in.txt", b"put in\n", 0o600),
                             BoxFile(box.bin_dir / "tool", b"#!/bin/sh\necho tool-ran\n", 0o755)))  # fmt: skip
        (box.workspace / "host-only.txt").write_text("written on the host's copy alone\n")
        before = containers()
        script = (f"cat in.txt; stat -c '%a %n' in.txt {box.bin_dir}/tool; tool; test -e host-only.txt || "
                  f"echo host-only-absent; echo made > out.txt; exec sleep {seconds}")
        launch = AgentLaunch(argv=("sh", "-c", script), env={}, cwd=box.workspace)
        stop = asyncio.Event()
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None), stop=stop))
        assert await wait_until(lambda: sleeping(seconds), within_s=30), "never started"
        (started,) = containers() - before
        mounts = mounts_of(started)
        stop.set()
        result = await run
        assert not (box.workspace / "out.txt").exists()  # the box's files are not the host's
        await box.pull_workspace()
        assert (box.workspace / "out.txt").read_text() == "made\n"
        assert not (box.workspace / "host-only.txt").exists()  # the host's copy is now the box's
        tool, root = box.bin_dir / "tool", box.root
    assert result.stdout.splitlines() == ["put in", "600 in.txt", f"755 {tool}", "tool-ran", "host-only-absent"]
    assert [(m["Type"], m["Destination"]) for m in mounts] == [("volume", str(root))]


async def test_closing_the_box_removes_its_volume_and_every_container():
    before_volumes, before_containers = volumes(), containers()
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        result = await box.exec("echo hi > a.txt && cat a.txt", timeout_s=BOUND_S)
        assert result.ok and result.output == "hi\n", result
        assert len(volumes() - before_volumes) == 1
    assert volumes() == before_volumes
    assert containers() == before_containers


async def test_a_pushed_workspace_replaces_the_boxs_and_a_pull_leaves_out_links_that_point_out():
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        made = await box.exec("echo old > gone.txt && echo kept > kept.txt && ln -s kept.txt inner && "
                              "ln -s /etc/passwd outer && ln -s ../home escape", timeout_s=BOUND_S)  # fmt: skip
        assert made.ok, made
        await box.pull_workspace()
        names = sorted(path.name for path in box.workspace.iterdir())
        assert names == ["gone.txt", "inner", "kept.txt"]
        assert (box.workspace / "inner").read_text() == "kept\n"
        (box.workspace / "gone.txt").unlink()
        (box.workspace / "new.txt").write_text("from the host\n")
        await box.push_workspace()
        listed = await box.exec("ls -A && cat new.txt", timeout_s=BOUND_S)
    assert listed.ok and listed.output.split() == ["inner", "kept.txt", "new.txt", "from", "the", "host"], listed


@pytest.mark.e2e
async def test_pi_in_a_box_sharing_no_files_with_the_host_fixes_a_bug_and_earns_1(server, scripted, tmp_path):
    """Pi's install and Node come in the image made for the run, its config and `answer` through `docker cp`, its
    model calls over the exec pipe; the grader's command runs in the box, and the fix reaches the host's copy."""
    binary = require_agent(PI)
    pi = PiAgent(binary=binary, context_window=MAX_MODEL_LEN)
    node = Path(shutil.which("node") or "/usr/bin/node").resolve()
    url = urlsplit(server.url)
    workspace = tmp_path / "task"
    workspace.mkdir()
    (workspace / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    task = Task(id="calc-remote", instruction="Fix add in calc.py.", workspace=workspace,
                grader=Grader(kind="command", command="python3 -c 'import calc; assert calc.add(2, 3) == 5'"))
    boxes: list[RemoteDockerSandbox] = []

    def make() -> RemoteDockerSandbox:
        boxes.append(sandbox(endpoint=(url.hostname, url.port), mounts=(binary.parents[2], node)))
        return boxes[-1]

    scripted.script(bash_call("sed -i '2s/a - b/a + b/' calc.py && cat /proc/1/comm; grep -c ' - ' calc.py; "
                              f"test ! -e {workspace} || echo task-dir-visible"), "Fixed add.")  # fmt: skip
    async with asyncio.timeout(300):
        (record,) = await Runner(server, RunnerConfig(agent=pi, sandbox=make)).run_tasks([task], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    assert_token_exact(record, scripted.calls)
    tool_output = next(m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool")
    # the container's init; no ' - ' left; the task's host directory not there
    assert tool_output.split() == ["docker-init", "0"], tool_output
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"  # the task's own, untouched
