"""A rollout's box, attacked from inside: `tests/agents/adversary.py` tries every way out it knows, in each backend
(namespace, Docker), while the host has planted what an attacker wants and counts what reaches it.

Planted on the host, outside /tmp (the old sandbox hid only /tmp and the sandboxes' parent): Unix sockets listening
in /run, /var/tmp, a home directory and a project folder (decoys for the Docker daemon's socket, which this test
cannot count connections on); a task file with its expected answer, a hidden test file, another run's records and
journal and an admin token file (mode 0600); a TCP listener on another loopback port; and a real interception server
(no admin token) with its record file in that project folder. The box gets its own rollout's endpoint, which must
still work (the positive control), and nothing else: no decoy is connected to, no secret appears in what the box
saw, only its rollout's routes answer through its bridge, and its rollout stays live (the box cannot finish it).

The limits are exercised the same way: a fork flood, a disk flood, a connection flood and a memory hog each run into
their limit, and each is reported as an event of the run (`RunResult.limits_hit`); the disk flood ends the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents import AgentLaunch, LocalSandboxConfig, RunLimits
from agents.sandbox import netbridge
from agents.sandbox.cgroups import DEFAULT_LIMITS, ResourceLimits, cgroups_unavailable
from agents.sandbox.docker import DockerSandbox, docker_unavailable
from agents.sandbox.namespace import NamespaceSandbox, namespaces_unavailable
from agents.sandbox.netbridge import MAX_CONNECTIONS
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig

ADVERSARY = Path(__file__).with_name("adversary.py").resolve()
IMAGE = "interceptor/debian-python:bookworm"  # scripts/setup-docker.sh builds it offline
FAST = LocalSandboxConfig(kill_grace_s=0.5, poll_s=0.05)
BOUND_S = 120.0
EXPECTED = "494343024"  # the task file's answer
HIDDEN_TEST = "def test_hidden_7f3a(): assert solve() == 11"
OTHER_RECORD = '{"rollout_id": "other-run-5b1e", "reward": 1.0}'
JOURNAL_LINE = '{"e":"open","id":"journal-secret-9c2d"}'
ADMIN_TOKEN = "admin-token-e0a4417b"
SECRETS = (EXPECTED, "test_hidden_7f3a", "other-run-5b1e", "journal-secret-9c2d", ADMIN_TOKEN)


def _docker_why_not() -> str | None:
    if (reason := docker_unavailable()) is not None:
        return reason
    done = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=20, check=False)
    return None if done.returncode == 0 else f"image {IMAGE} is missing: run scripts/setup-docker.sh"


def _require(why_not: str | None, what: str) -> None:
    """Skip where the backend cannot run here; under CI (CI=true) fail instead: a box that cannot be attacked
    must not pass for one that held."""
    if why_not is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is needed under CI: {why_not}")
        pytest.skip(f"{what}: {why_not}")


@dataclass
class Planted:
    """What the host laid out for the attacker, and what reached it."""

    project: Path
    files: list[Path]
    dirs: list[Path]
    sockets: list[Path]
    port: int
    hits: list[str] = field(default_factory=list)  # "unix PATH" / "tcp": connections the decoys took


@pytest.fixture
async def planted() -> AsyncIterator[Planted]:
    tag = secrets.token_hex(4)
    project = Path.cwd() / f".box-test-{tag}"  # a project folder: not under /tmp, as a user's checkout
    home = Path.home() / f".box-test-{tag}"
    places = [project, home]
    for place in places:
        place.mkdir(mode=0o700)
    (project / "tasks.jsonl").write_text(json.dumps({"id": "t", "instruction": "guess",
                                                     "grader": {"kind": "answer", "expected": EXPECTED}}) + "\n")
    (project / "hidden_test.py").write_text(HIDDEN_TEST + "\n")
    runs = project / "runs" / "other"
    runs.mkdir(parents=True)
    (runs / "rollouts.jsonl").write_text(OTHER_RECORD + "\n")
    (runs / "rollouts.jsonl.journal.000001").write_text(JOURNAL_LINE + "\n")
    token = home / "admin.token"
    token.write_text(ADMIN_TOKEN)
    token.chmod(0o600)
    files = [project / "tasks.jsonl", project / "hidden_test.py", runs / "rollouts.jsonl",
             runs / "rollouts.jsonl.journal.000001", token]
    socket_paths = [Path(f"/run/decoy-{tag}.sock"), Path(f"/var/tmp/decoy-{tag}.sock"), home / "decoy.sock",
                    project / "decoy.sock"]
    hits: list[str] = []
    async with AsyncExitStack() as stack:
        for path in socket_paths:
            path.parent.mkdir(parents=True, exist_ok=True)

            def count(reader, writer, path=path):
                hits.append(f"unix {path}")
                writer.close()

            server = await asyncio.start_unix_server(count, path=str(path))
            stack.push_async_callback(server.wait_closed)
            stack.callback(server.close)
            stack.callback(path.unlink, missing_ok=True)

        def count_tcp(reader, writer):
            hits.append("tcp")
            writer.close()

        listener = await asyncio.start_server(count_tcp, "127.0.0.1", 0)
        stack.push_async_callback(listener.wait_closed)
        stack.callback(listener.close)
        stack.callback(shutil.rmtree, project, ignore_errors=True)
        stack.callback(shutil.rmtree, home, ignore_errors=True)
        yield Planted(project=project, files=files, dirs=[project, home, runs], sockets=socket_paths,
                      port=listener.sockets[0].getsockname()[1], hits=hits)


@pytest.fixture
async def server(scripted, tiny_model_dir, planted) -> AsyncIterator[InterceptionServer]:
    config = ServerConfig(
        upstream=UpstreamConfig(base_url=scripted.url, attempts=1, request_timeout_s=20),
        model_dir=tiny_model_dir,
        record_path=planted.project / "records" / "rollouts.jsonl",  # beside the project, as `--record runs/x.jsonl`
    )
    async with InterceptionServer(config) as server:
        yield server


BACKENDS = [pytest.param("namespace", id="namespace"), pytest.param("docker", id="docker")]


def _box(backend: str, endpoint: tuple[str, int], **kwargs):
    if backend == "namespace":
        _require(namespaces_unavailable(), "the namespace sandbox")
        return NamespaceSandbox(FAST, endpoint=endpoint, **kwargs), sys.executable
    _require(_docker_why_not(), "the Docker sandbox")
    return DockerSandbox(FAST, image=IMAGE, endpoint=endpoint, **kwargs), "python3"


async def _attack(box, python: str, env: dict[str, str], limits: RunLimits = RunLimits(wall_s=BOUND_S, idle_s=None)):
    launch = AgentLaunch(argv=(python, str(ADVERSARY)), env=env, cwd=box.workspace, host_paths=(ADVERSARY,))
    result = await box.run(launch, limits=limits)
    lines = result.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return result, report


def _blocked(value: object) -> bool:
    return isinstance(value, str) and value.startswith("blocked")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_nothing_of_the_host_is_reachable_from_a_box(backend, server, planted):
    endpoint = ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    handle = server.open_rollout()
    box, python = _box(backend, endpoint)
    env = {
        "OPENAI_BASE_URL": handle.base_url,
        "OPENAI_API_KEY": handle.secret,
        "ADV_SOCKETS": ":".join(map(str, planted.sockets)),
        "ADV_FILES": ":".join(map(str, [*planted.files, server.config.record_path])),
        "ADV_DIRS": ":".join(map(str, [*planted.dirs, Path.cwd(), Path.cwd() / "examples" / "tasks"])),
        "ADV_PORTS": f"{planted.port},22,2375,2376",
        "ADV_SERVER_PORT": str(endpoint[1]),
        "ADV_ROLLOUT": handle.id,
    }
    async with asyncio.timeout(BOUND_S), box:
        result, report = await _attack(box, python, env)
    assert result.ok and report, (result.stdout[-2000:], result.stderr[-2000:])

    # The host's evidence first: nothing reached a decoy, the rollout is still live (not finished from inside).
    assert planted.hits == []
    assert server.rollout(handle.id) is not None
    # What the box saw: no secret, no socket but its own bridge's, none of the host's places.
    seen = json.dumps(report)
    assert not [s for s in SECRETS if s in seen], seen
    assert report["sockets seen"] == {}
    # A folder above what the box runs from (the interpreter, the bridge's and the shim's scripts, this adversary)
    # holds that skeleton alone: of the checkout, no README, no examples/tasks; of a home, nothing but the interpreter.
    skeleton = {part for p in (sys.prefix, sys.base_prefix, ADVERSARY, netbridge.__file__, "/run", "/var/run")
                for part in Path(p).resolve().parts} | {""}
    # In a container, the adversary's fixed paths (/etc/shadow, /root, /run, ...) are the image's own, not the host's.
    fixed = {"read /etc/shadow", "read /etc/gshadow", "read /root/.bash_history", "read /root/.ssh/id_rsa",
             "list /root", "list /home", "list /run", "list /var/run"}
    image_own = fixed if backend == "docker" else set()
    for key, value in report.items():
        if key.startswith(("unix ", "read ", "tcp ")) and key not in image_own:
            assert _blocked(value), (key, value)
        if key.startswith("list ") and key not in image_own:
            assert _blocked(value) or set(value.removeprefix("listed: ").split(",")) <= skeleton, (key, value)
    # Through its endpoint: its own rollout's routes, and nothing of the server's others.
    assert report["own endpoint"].startswith("200:"), report["own endpoint"]
    for key in ("GET /metrics", "GET /health", "POST /rollouts", "finish itself with reward 1"):
        assert report[key].startswith("404:") and "only the rollout's own routes" in report[key], (key, report[key])
    for key in [k for k in report if k.startswith("raw ")]:
        assert report[key].startswith("HTTP/1.1 404") or report[key] in ("", "blocked: ConnectionResetError"), (
            key, report[key])
    smuggled = report["second request on a kept-alive connection"]
    assert smuggled.startswith("HTTP/1.1 401") and "interceptor_" not in smuggled  # its own route, then cut off
    assert "interceptor_" not in report["length and chunked at once"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_limit_a_box_runs_into_is_an_event_and_a_disk_flood_ends_the_run(backend, server):
    if backend == "namespace":
        _require(cgroups_unavailable(), "cgroups")
    endpoint = ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    box, python = _box(backend, endpoint, **({"resources": ResourceLimits(pids=48, memory_bytes=256 * 2**20)}
                                             if backend == "namespace" else
                                             {"limits": ResourceLimits(pids=48, memory_bytes=256 * 2**20)}))
    env = {"ADV_SERVER_PORT": str(endpoint[1]), "OPENAI_BASE_URL": server.url + "/rollout/x/v1"}
    async with asyncio.timeout(BOUND_S), box:
        forks, forked = await _attack(box, python, {**env, "ADV_FLOOD": "fork"})
        flood, _ = await _attack(box, python, {**env, "ADV_FLOOD": "disk"},
                                 RunLimits(wall_s=BOUND_S, idle_s=None, disk_bytes=48 * 2**20))
        conns, connected = await _attack(box, python, {**env, "ADV_FLOOD": "connections"})
        memory, hog = await _attack(box, python, {**env, "ADV_FLOOD": "memory"})
    assert forked["fork flood started"] < 48 and dict(forks.limits_hit).get("pids", 0) >= 1 or backend == "docker", (
        forked, forks.limits_hit)
    if backend == "docker":  # the daemon enforces it; its counters are the daemon's own
        assert forked["fork flood started"] < 48, forked
    assert (flood.outcome, dict(flood.limits_hit)) == ("limit", {"disk": 1}), flood
    assert "over its" in flood.reason
    assert connected["connections refused"] >= 150 - MAX_CONNECTIONS, connected
    assert dict(conns.limits_hit).get("connections", 0) >= 150 - MAX_CONNECTIONS, conns.limits_hit
    assert hog["memory hog exit"] != 0, hog
    if backend == "namespace":
        assert dict(memory.limits_hit).get("memory", 0) >= 1, memory.limits_hit


def test_every_box_has_limits_by_default():
    """Without a word from the caller: memory and processes (where cgroups can be made), the disk a run may fill,
    and the connections a box may hold to its endpoint."""
    if cgroups_unavailable() is None:
        assert NamespaceSandbox().resources == DEFAULT_LIMITS
    assert DockerSandbox(image=IMAGE).container_limits == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.memory_bytes and DEFAULT_LIMITS.pids
    assert RunLimits().disk_bytes is not None and MAX_CONNECTIONS > 0
    assert NamespaceSandbox(resources=ResourceLimits()).resources is None  # asked for none: none


FORGER = Path(__file__).with_name("forger.py").resolve()


@pytest.mark.parametrize("sandbox", ["default", "local"])
async def test_an_answer_in_a_task_file_cannot_be_forged_from_the_default_box(sandbox, server, planted):
    """Through the real runner: the task is loaded from a project folder (not /tmp) and its instruction names the
    file. In the default box the forger finds nothing and earns 0; in `LocalSandbox` (no isolation) the same forger
    reads the answer and earns 1, which is what the box is for."""
    from agents import CommandAgent, LocalSandbox
    from agents.runner import Runner, RunnerConfig
    from agents.tasks import load_tasks

    if sandbox == "default":
        _require(namespaces_unavailable(), "the namespace sandbox")
    task_file = planted.project / "tasks.jsonl"
    task_file.write_text(json.dumps({
        "id": "forge", "instruction": f"The answer is in {task_file}. Submit it with: answer VALUE",
        "grader": {"kind": "answer", "expected": EXPECTED}, "limits": {"wall_s": 120, "idle_s": 120}}) + "\n")
    (task,) = load_tasks(task_file)
    config = RunnerConfig(agent=CommandAgent(argv=(sys.executable, str(FORGER))),
                          sandbox=(lambda: LocalSandbox(FAST)) if sandbox == "local" else None)
    async with asyncio.timeout(BOUND_S):
        (record,) = await Runner(server, config).run_tasks([task], n=1)
    assert record.status == "ok", record.failure
    if sandbox == "default":
        assert (record.answer, record.reward) == ("not-found", 0.0)
    else:
        assert (record.answer, record.reward) == (EXPECTED, 1.0)
