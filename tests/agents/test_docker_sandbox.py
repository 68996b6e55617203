"""DockerSandbox: the agent runs in a container of the task's image, reaching only its model endpoint.

Run where a Docker daemon answers and the image that scripts/setup-docker.sh builds offline is present; skipped
otherwise, with the reason. What happened is judged on the host (the workspace, the model server's log, a listener's
connections, the daemon's container list, the host's process table: a container's processes are host processes
too), never taken from the container's word alone. The attacks and fakes are those of the isolation suite.
"""

from __future__ import annotations

import asyncio
import functools
import random
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agents import AgentLaunch, LocalSandboxConfig, PiAgent, RunLimits
from agents.answer_command import write_answer_command
from agents.runner import Runner, RunnerConfig
from agents.sandbox.docker import LABEL, ContainerLimits, DockerSandbox, docker_unavailable
from agents.sandbox.docker.remote import RemoteDockerSandbox
from agents.sandbox.namespace import SandboxUnavailable
from agents.specs.packages import PI
from agents.specs.spec import write_private_json
from agents.tasks import Grader, Task
from tests.agents.agent_runs import MAX_MODEL_LEN, bash_call, require_agent
from tests.invariants import assert_token_exact

from .test_isolation import (  # noqa: F401  (model_server and other_listener are fixtures)
    A_CHAT_SECRET,
    A_ENV_SECRET,
    A_FILE_SECRET,
    A_TOOLS_SECRET,
    ATTACK_SCRIPT,
    ATTACKS,
    B_SECRET,
    alive,
    host_pids,
    model_server,
    other_listener,
    wait_for_file,
    wait_until,
)
from .test_swe import server, suite, tasks  # noqa: F401  (fixtures: the offline SWE suite, a server on port 0)

IMAGE = "interceptor/debian-python:bookworm"  # python3 in a minimal Debian root: scripts/setup-docker.sh
FAST = LocalSandboxConfig(kill_grace_s=0.5, poll_s=0.05)
BOUND_S = 60.0  # every test as a whole; a hang fails instead of blocking the suite
SECRET = "docker-chat-5b1e0c"


def _why_not() -> str | None:
    if (reason := docker_unavailable()) is not None:
        return reason
    done = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=20, check=False)
    return None if done.returncode == 0 else f"image {IMAGE} is missing: run scripts/setup-docker.sh"


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"docker sandbox: {WHY_NOT}")


def sandbox(endpoint: tuple[str, int] | None = None) -> DockerSandbox:
    return DockerSandbox(FAST, image=IMAGE, endpoint=endpoint)


def containers() -> set[str]:
    """Names of the sandbox containers the daemon has, running or not."""
    listed = subprocess.run(["docker", "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"],
                            capture_output=True, text=True, timeout=20, check=True)  # fmt: skip
    return set(listed.stdout.split())


def long_sleep() -> str:
    """A `sleep` argument no other process of this machine has, to find the container's processes by."""
    return f"{random.randrange(10**6, 10**7)}.{random.randrange(10**3):03d}"


def sleeping(seconds: str) -> list[int]:
    """Host pids of `sleep SECONDS` (the docker client's argv holds more, so it is not one of them)."""
    argv = f"sleep\0{seconds}\0".encode()
    return host_pids(lambda cmdline, environ: cmdline == argv)


async def test_a_command_runs_in_the_container_and_writes_the_workspace():
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        result = await box.exec("test -f /.dockerenv && hostname && echo made > out.txt && pwd", timeout_s=BOUND_S)
        assert result.ok, result
        assert result.output.splitlines() == ["sandbox", str(box.workspace)]
        assert (box.workspace / "out.txt").read_text() == "made\n"  # seen on the host: the same directory


async def test_exec_returns_the_output_and_the_exit_code():
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        ok = await box.exec("echo out; echo err >&2", timeout_s=BOUND_S)
        failed = await box.exec("echo before; exit 7", timeout_s=BOUND_S)
        missing = await box.exec("no-such-command-here", timeout_s=BOUND_S)
    assert (ok.exit_code, ok.output) == (0, "out\nerr\n")
    assert (failed.exit_code, failed.output) == (7, "before\n")
    assert missing.exit_code == 127


async def test_the_agent_gets_its_argv_env_stdin_and_cwd_and_its_program_is_looked_up_in_the_image():
    script = "import os, sys; print(os.getcwd(), os.environ['KEY'], sys.stdin.read(), sys.argv[1:])"
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        launch = AgentLaunch(argv=("python3", "-c", script, "arg"), env={"KEY": SECRET}, cwd=box.workspace,
                             stdin=b"instruction", secrets=(SECRET,))  # fmt: skip
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S))
        assert result.ok, result
        assert result.stdout == f"{box.workspace} *** instruction ['arg']\n"  # the secret scrubbed from the tail


async def test_env_values_are_in_no_argv_on_the_host():
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        seconds = long_sleep()
        launch = AgentLaunch(argv=("sleep", seconds), env={"KEY": SECRET}, cwd=box.workspace, secrets=(SECRET,))
        stop = asyncio.Event()
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None), stop=stop))
        try:
            assert await wait_until(lambda: sleeping(seconds), within_s=30), "the container never started"
            assert host_pids(lambda cmdline, environ: SECRET.encode() in cmdline) == []  # the docker client's too
            [pid] = sleeping(seconds)
            assert SECRET.encode() in Path(f"/proc/{pid}/environ").read_bytes()  # and yet the agent has it
        finally:
            stop.set()
            assert (await run).outcome == "cancelled"


# Run in a box: connects to another host port (argv[1]), then asks the model endpoint for its models.
ENDPOINT_PROBE = r"""
import os, socket, sys, urllib.request
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
    print("tcp-connected")
except OSError as exc:
    print("refused:", exc)
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/models",
                                 headers={"Authorization": "Bearer " + os.environ["KEY"]})
print("model-endpoint:", urllib.request.urlopen(request, timeout=10).read().decode())
"""


BACKENDS = pytest.mark.parametrize("make", [DockerSandbox, RemoteDockerSandbox], ids=["bound", "remote"])


@BACKENDS
async def test_the_model_endpoint_is_reached_through_the_bridge_and_another_host_port_is_not(
    model_server, other_listener, make
):
    """Remote: the bridge's socket is the box's own, carried over a `docker exec` pipe to the host half."""
    async with asyncio.timeout(BOUND_S), make(FAST, image=IMAGE) as box:
        launch = AgentLaunch(
            argv=("python3", "-c", ENDPOINT_PROBE, str(other_listener.port)),
            # `localhost`, as an agent's config may say: inside, the endpoint is 127.0.0.1
            env={"OPENAI_BASE_URL": model_server.base_url("localhost"), "KEY": SECRET},
            cwd=box.workspace,
        )
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S))
    assert result.ok, result
    assert "refused:" in result.stdout and "tcp-connected" not in result.stdout
    assert not other_listener.connected.is_set()
    assert '"id": "policy"' in result.stdout
    assert model_server.authorizations == [f"Bearer {SECRET}"]


@BACKENDS
async def test_large_requests_and_streamed_replies_cross_the_bridge_whole_on_parallel_connections(
    model_server, make
):
    script = """
import hashlib, http.client, os, sys, threading
body = os.urandom(3 * 1024 * 1024)
results = []
def call():
    connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
    for _ in range(2):
        connection.request("POST", "/rollout/b/v1/echo", body=body)
        results.append(hashlib.sha256(connection.getresponse().read()).digest() == hashlib.sha256(body).digest())
threads = [threading.Thread(target=call) for _ in range(3)]
for thread in threads: thread.start()
for thread in threads: thread.join()
print(results)
"""
    async with asyncio.timeout(BOUND_S), make(FAST, image=IMAGE, endpoint=("127.0.0.1", model_server.port)) as box:
        launch = AgentLaunch(argv=("python3", "-c", script, str(model_server.port)), env={}, cwd=box.workspace)
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S))
    assert result.ok, result
    assert result.stdout == f"{[True] * 6}\n"


async def test_another_rollouts_container_can_neither_read_write_signal_nor_connect(model_server, other_listener):
    """The isolation suite's attacks, from a tool command of rollout B's container against rollout A's."""
    async with asyncio.timeout(BOUND_S), sandbox() as a, sandbox() as b:
        (a.workspace / "secret.txt").write_text(A_FILE_SECRET + "\n")
        write_private_json(a.home / ".pi" / "agent" / "models.json", {"apiKey": A_CHAT_SECRET})
        write_answer_command(a.bin_dir, base_url="http://127.0.0.1:9/rollout/a/v1", tools_secret=A_TOOLS_SECRET)
        a_launch = AgentLaunch(argv=("sh", "-c", "echo up > ready; exec sleep 300"),
                               env={"HOME": str(a.home), "A_KEY": A_ENV_SECRET}, cwd=a.workspace)  # fmt: skip
        stop_a = asyncio.Event()
        a_run = asyncio.create_task(a.run(a_launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None), stop=stop_a))
        try:
            await wait_for_file(a.workspace / "ready")
            [a_pid] = host_pids(lambda cmd, env: cmd.startswith(b"sleep\0") and A_ENV_SECRET.encode() in env)
            b_launch = AgentLaunch(
                argv=("sh", "-c", ATTACK_SCRIPT),
                env={"HOME": str(b.home), "PY": "python3", "A_WS": str(a.workspace), "A_HOME": str(a.home),
                     "A_BIN": str(a.bin_dir), "A_PID": str(a_pid), "OTHER_PORT": str(other_listener.port),
                     "OPENAI_BASE_URL": model_server.base_url(), "B_KEY": B_SECRET},
                cwd=b.workspace,
            )  # fmt: skip
            result = await b.run(b_launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None))
            out = result.stdout
            assert result.ok and out.endswith("finished\n"), result
            succeeded = {
                "read A's workspace": A_FILE_SECRET in out,
                "read A's home (models.json)": A_CHAT_SECRET in out,
                "read A's answer script": A_TOOLS_SECRET in out,
                "read A's /proc/PID/environ": A_ENV_SECRET in out,
                "write into A's workspace": (a.workspace / "pwned").exists(),
                "kill -9 A's process": not alive(a_pid),
                "connect to another host port": other_listener.connected.is_set(),
            }
        finally:
            stop_a.set()
            await a_run
    assert succeeded == dict.fromkeys(ATTACKS, False)
    assert '"id": "policy"' in out
    assert model_server.authorizations == [f"Bearer {B_SECRET}"]


@BACKENDS
async def test_a_timeout_ends_every_process_of_the_container_and_leaves_no_container(make):
    seconds = long_sleep()
    # The agent and a detached child both ignore SIGTERM: only the container's removal ends them.
    script = f"trap '' TERM; (trap '' TERM; sleep {seconds}) & sleep {seconds}"
    async with asyncio.timeout(BOUND_S), make(FAST, image=IMAGE) as box:
        before = containers()
        launch = AgentLaunch(argv=("sh", "-c", script), env={}, cwd=box.workspace)
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=3, idle_s=None)))
        assert await wait_until(lambda: len(sleeping(seconds)) == 2, within_s=30), "never started"
        started = containers() - before
        result = await run
        assert result.outcome == "timeout", result
        assert len(started) == 1
        assert await wait_until(lambda: not sleeping(seconds), within_s=20)
        assert not containers() & started


async def test_a_cancelled_run_removes_its_container():
    seconds = long_sleep()
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        before = containers()
        launch = AgentLaunch(argv=("sleep", seconds), env={}, cwd=box.workspace)
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None)))
        assert await wait_until(lambda: sleeping(seconds), within_s=30), "never started"
        started = containers() - before
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert len(started) == 1
        assert await wait_until(lambda: not sleeping(seconds), within_s=20)
        assert await wait_until(lambda: not containers() & started, within_s=20)


async def test_an_image_that_is_not_here_is_refused_on_entry():
    with pytest.raises(SandboxUnavailable, match="not available"):
        async with DockerSandbox(FAST, image=f"interceptor/no-such-image:{uuid.uuid4().hex[:8]}"):
            pass


async def test_container_limits_reach_the_containers_cgroup():
    read = "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"
    box = DockerSandbox(FAST, image=IMAGE, limits=ContainerLimits(pids=64, memory_bytes=256 * 1024 * 1024))
    async with asyncio.timeout(BOUND_S), box:
        result = await box.exec(read, timeout_s=BOUND_S)
    assert (result.exit_code, result.output) == (0, "64\n")


@pytest.mark.e2e
async def test_pi_inside_a_container_fixes_a_swe_bug_through_the_bridge_and_earns_1(tasks, server, scripted):
    """Pi from the host's agent cache and Node, the grader's Python from the host, all mounted read-only; the
    image brings the rest (a shell, git). The tool's `cat /proc/1/comm` shows it ran under the container's init."""
    binary = require_agent(PI)
    pi = PiAgent(binary=binary, context_window=MAX_MODEL_LEN)
    node = Path(shutil.which("node") or "/usr/bin/node").resolve()
    mounts = (binary.parents[2], node, Path(sys.prefix), Path(sys.base_prefix))  # the package, node, the venv
    url = urlsplit(server.url)
    make = functools.partial(DockerSandbox, image=IMAGE, endpoint=(url.hostname, url.port), mounts=mounts)
    scripted.script(bash_call("sed -i '2s/a - b/a + b/' calc.py && cat /proc/1/comm"), "Fixed add.")
    async with asyncio.timeout(180):
        (record,) = await Runner(server, RunnerConfig(agent=pi, sandbox=make)).run_tasks([tasks["tiny__calc-1"]], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    assert_token_exact(record, scripted.calls)
    tool_output = next(m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool")
    assert tool_output.strip() == "docker-init"


async def test_pi_submits_with_answer_run_by_the_images_python_not_the_hosts(server, scripted):
    """Only Pi's package and Node are mounted: its config files and the `answer` command go in through the sandbox
    (`put_files`), and `answer` runs on the image's Python (no interpreter of this host is in the container)."""
    binary = require_agent(PI)
    pi = PiAgent(binary=binary, context_window=MAX_MODEL_LEN)
    node = Path(shutil.which("node") or "/usr/bin/node").resolve()
    url = urlsplit(server.url)
    make = functools.partial(DockerSandbox, image=IMAGE, endpoint=(url.hostname, url.port),
                             mounts=(binary.parents[2], node))
    task = Task(id="submit-7", instruction="Submit 7 with: answer 7", grader=Grader(kind="answer", expected="7"))
    scripted.script(bash_call(f"test -e {sys.executable} || echo no-host-python; head -1 $(command -v answer); "
                              "answer 7"), "Submitted.")
    async with asyncio.timeout(180):
        (record,) = await Runner(server, RunnerConfig(agent=pi, sandbox=make)).run_tasks([task], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    tool_output = next(m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool")
    assert "no-host-python" in tool_output and "#!/usr/bin/env python3" in tool_output, tool_output


@pytest.mark.e2e
async def test_a_task_with_an_image_runs_in_a_container_of_it_without_being_told(tasks, server, scripted):
    """The runner's own choice: the SWE instance names an image, so the agent, the set-up and the tests run in
    a container of it; what Pi and the grader's Python need from the host comes from the launch's host_paths."""
    import dataclasses

    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    task = dataclasses.replace(tasks["tiny__calc-1"], image=IMAGE)
    scripted.script(bash_call("sed -i '2s/a - b/a + b/' calc.py && cat /proc/1/comm"), "Fixed add.")
    async with asyncio.timeout(180):
        (record,) = await Runner(server, RunnerConfig(agent=pi)).run_tasks([task], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    tool_output = next(m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool")
    assert tool_output.strip() == "docker-init"


# ------------------------------------------------------------------------------------------------ warm containers

REPORT = (
    "import json, os, sys\n"
    "print(json.dumps({'cwd': os.getcwd(), 'argv': sys.argv[1:], 'stdin': sys.stdin.read(), 'env': dict(os.environ)},"
    " sort_keys=True))\n"
)


@pytest.mark.parametrize("stdin", [b"the instruction\n", None], ids=["stdin", "no-stdin"])
async def test_a_warm_container_run_gets_the_same_argv_env_cwd_and_stdin_as_a_cold_one(stdin):
    def launch(box: DockerSandbox) -> AgentLaunch:
        return AgentLaunch(argv=("python3", "-c", REPORT, "one", "two words"), env={"KEY": SECRET},
                           cwd=box.workspace, stdin=stdin, secrets=(SECRET,))  # fmt: skip

    async with asyncio.timeout(BOUND_S):
        async with sandbox() as cold_box:
            cold = await cold_box.run(launch(cold_box), limits=RunLimits(wall_s=BOUND_S))
            cold_root = str(cold_box.root)
        async with sandbox() as warm_box:
            await warm_box.warm()
            warm = await warm_box.run(launch(warm_box), limits=RunLimits(wall_s=BOUND_S))
            assert warm_box.warm_starts == 1
            warm_root = str(warm_box.root)
    assert cold.ok and warm.ok, (cold, warm)
    assert warm.stdout.replace(warm_root, "ROOT") == cold.stdout.replace(cold_root, "ROOT")


async def test_a_warm_container_stays_warm_and_no_container_outlives_the_sandbox():
    async with asyncio.timeout(BOUND_S):
        before = containers()
        async with sandbox() as box:
            await box.warm()
            results = [await box.exec(f"test -f /.dockerenv && echo run {i}", timeout_s=BOUND_S) for i in range(3)]
            assert box.warm_starts == 3
            assert await wait_until(lambda: box.warm_ready, within_s=30)
            assert len(containers() - before) == 1  # the next run's container, waiting
        assert [r.output for r in results] == [f"run {i}\n" for i in range(3)]
        assert await wait_until(lambda: not containers() - before, within_s=30)


async def test_a_launch_needing_a_host_path_the_warm_container_lacks_starts_cold(tmp_path):
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "hello.sh").write_text("echo from the host\n")
    async with asyncio.timeout(BOUND_S), sandbox() as box:
        await box.warm()
        launch = AgentLaunch(argv=("sh", str(tool / "hello.sh")), env={}, cwd=box.workspace, host_paths=(tool,))
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S))
        assert box.warm_starts == 0
    assert result.ok and result.stdout == "from the host\n", result
