"""Isolation between rollouts: what a tool command of rollout B can do to rollout A, running at the same time.

A holds secrets as an agent does (a provider key in its environment and in `models.json` under its home, a tools
secret in its `answer` script, a file in its workspace) and keeps a process running. B runs one shell script, as an
agent's shell tool would, that tries to read, write, signal and connect. What happened is judged on the host (A's
files, A's process, a listener's connections), never taken from B's word alone.

Under `NamespaceSandbox` every attack fails and B still reaches its own model endpoint. Under `LocalSandbox` they
succeed: it is for trusted programs, and these tests keep that exposure written down.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from agents import AgentLaunch, LocalSandbox, LocalSandboxConfig, RunLimits
from agents.answer_command import write_answer_command
from agents.sandbox.namespace import NamespaceSandbox, namespaces_unavailable
from agents.specs.spec import write_private_json

FAST = LocalSandboxConfig(kill_grace_s=0.5, poll_s=0.05)
BOUND_S = 60.0  # every test as a whole; a hang fails instead of blocking the suite
NO_NAMESPACES = namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(NO_NAMESPACES is not None, reason=f"namespace sandbox: {NO_NAMESPACES}")

A_ENV_SECRET = "a-env-3c1f9e"  # in A's process environment
A_CHAT_SECRET = "a-chat-77d0b2"  # in A's models.json (0600)
A_TOOLS_SECRET = "a-tools-5e8a41"  # in A's answer script (0700)
A_FILE_SECRET = "a-file-0b96cd"  # in A's workspace
B_SECRET = "b-chat-4a2f6d"

ATTACKS = (
    "read A's workspace",
    "read A's home (models.json)",
    "read A's answer script",
    "read A's /proc/PID/environ",
    "write into A's workspace",
    "kill -9 A's process",
    "connect to another host port",
)

# B's tool command: each attempt says what it got; the host checks the effect.
ATTACK_SCRIPT = r"""
cat "$A_WS/secret.txt"
cat "$A_HOME/.pi/agent/models.json"
cat "$A_BIN/answer"
tr '\0' '\n' < "/proc/$A_PID/environ" | grep A_KEY
for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; done 2>/dev/null | grep A_KEY=
echo pwned > "$A_WS/pwned"
"$PY" -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)" "$OTHER_PORT" \
    && echo tcp-connected
kill -9 "$A_PID" && echo kill-sent
"$PY" - <<'EOF'
import os, urllib.request
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/models",
                                 headers={"Authorization": "Bearer " + os.environ["B_KEY"]})
print("model-endpoint:", urllib.request.urlopen(request, timeout=10).read().decode())
EOF
echo finished
"""


def make(backend: type, endpoint: tuple[str, int] | None = None) -> LocalSandbox:
    if backend is NamespaceSandbox:
        return NamespaceSandbox(FAST, endpoint=endpoint)
    return LocalSandbox(FAST)


BACKENDS = [
    pytest.param(LocalSandbox, id="local"),
    pytest.param(NamespaceSandbox, id="namespace", marks=needs_namespaces),
]


@dataclass
class ModelServer:
    """The interception server's stand-in: a real aiohttp app on 127.0.0.1:0 that records who called."""

    port: int = 0
    authorizations: list[str] = field(default_factory=list)

    def base_url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/rollout/b/v1"


@pytest.fixture
async def model_server() -> AsyncIterator[ModelServer]:
    server = ModelServer()

    async def models(request: web.Request) -> web.Response:
        server.authorizations.append(request.headers.get("Authorization", ""))
        return web.json_response({"data": [{"id": "policy"}]})

    async def echo(request: web.Request) -> web.StreamResponse:
        body = await request.read()  # a long request in, a long streamed reply out: both directions of the bridge
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(body), 65536):
            await response.write(body[start : start + 65536])
        await response.write_eof()
        return response

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_get("/rollout/b/v1/models", models)
    app.router.add_post("/rollout/b/v1/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server.port = runner.addresses[0][1]
        yield server
    finally:
        await runner.cleanup()


@dataclass
class Listener:
    """Some other service on a host port, which no sandbox should reach."""

    port: int = 0
    connected: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def other_listener() -> AsyncIterator[Listener]:
    listener = Listener()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        listener.connected.set()
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    listener.port = server.sockets[0].getsockname()[1]
    try:
        yield listener
    finally:
        server.close()
        await server.wait_closed()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def host_pids(match) -> list[int]:
    """Live host processes whose (cmdline, environ) satisfy `match`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if match(cmdline, environ) and alive(int(entry)):
            found.append(int(entry))
    return found


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


async def wait_until(condition, *, within_s: float) -> bool:
    """Poll `condition` until it holds or `within_s` passes; for effects that land a moment after their cause."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def wait_for_file(path: Path) -> None:
    if not await wait_until(path.exists, within_s=20):
        raise AssertionError(f"{path} never appeared")


async def attack_from_b(
    backend: type, model_server: ModelServer, other_listener: Listener, *, warm_b: bool = False
) -> tuple[dict, str]:
    """Run A and B side by side; return {attack: succeeded} and B's stdout. `warm_b`: B's run is handed to a
    process started ahead (`warm`), with its endpoint given up front as the runner gives it."""
    b_endpoint = ("127.0.0.1", model_server.port) if warm_b else None
    async with make(backend) as a, make(backend, endpoint=b_endpoint) as b:
        if warm_b:
            await b.warm()
        (a.workspace / "secret.txt").write_text(A_FILE_SECRET + "\n")
        write_private_json(a.home / ".pi" / "agent" / "models.json", {"apiKey": A_CHAT_SECRET})
        write_answer_command(a.bin_dir, base_url="http://127.0.0.1:9/rollout/a/v1", tools_secret=A_TOOLS_SECRET)
        a_launch = AgentLaunch(
            argv=("sh", "-c", "echo up > ready; exec sleep 300"),
            env={"HOME": str(a.home), "A_KEY": A_ENV_SECRET},
            cwd=a.workspace,
        )
        stop_a = asyncio.Event()
        a_run = asyncio.create_task(a.run(a_launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None), stop=stop_a))
        try:
            await wait_for_file(a.workspace / "ready")
            [a_pid] = host_pids(lambda cmd, env: cmd.startswith(b"sleep\0") and A_ENV_SECRET.encode() in env)
            b_launch = AgentLaunch(
                argv=("sh", "-c", ATTACK_SCRIPT),
                env={
                    "HOME": str(b.home),
                    "PY": sys.executable,
                    "A_WS": str(a.workspace),
                    "A_HOME": str(a.home),
                    "A_BIN": str(a.bin_dir),
                    "A_PID": str(a_pid),
                    "OTHER_PORT": str(other_listener.port),
                    "OPENAI_BASE_URL": model_server.base_url(),
                    "B_KEY": B_SECRET,
                },
                cwd=b.workspace,
            )
            result = await b.run(b_launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None))
            assert b.warm_starts == int(warm_b)
            out = result.stdout
            assert result.ok and out.endswith("finished\n"), result
            succeeded = {
                "read A's workspace": A_FILE_SECRET in out,
                "read A's home (models.json)": A_CHAT_SECRET in out,
                "read A's answer script": A_TOOLS_SECRET in out,
                "read A's /proc/PID/environ": A_ENV_SECRET in out,
                "write into A's workspace": (a.workspace / "pwned").exists(),
                # B's claim only decides whether to wait for the effect; the effect decides the verdict.
                "kill -9 A's process": "kill-sent" in out and await wait_until(lambda: not alive(a_pid), within_s=5),
                "connect to another host port": "tcp-connected" in out
                and await wait_until(other_listener.connected.is_set, within_s=5),
            }
            return succeeded, out
        finally:
            stop_a.set()
            await a_run


@needs_namespaces
async def test_namespace_sandbox_blocks_every_attack_of_another_rollout_and_keeps_its_model_endpoint(
    model_server, other_listener
):
    async with asyncio.timeout(BOUND_S):
        succeeded, out = await attack_from_b(NamespaceSandbox, model_server, other_listener)
    assert succeeded == dict.fromkeys(ATTACKS, False)
    assert not other_listener.connected.is_set()
    assert '"id": "policy"' in out  # its own endpoint, through the bridge
    assert model_server.authorizations == [f"Bearer {B_SECRET}"]


async def test_local_sandbox_lets_another_rollout_read_write_signal_and_connect(model_server, other_listener):
    """LocalSandbox runs every rollout as the same user on the host: it is for trusted programs only."""
    async with asyncio.timeout(BOUND_S):
        succeeded, out = await attack_from_b(LocalSandbox, model_server, other_listener)
    assert succeeded == dict.fromkeys(ATTACKS, True)
    assert '"id": "policy"' in out


@needs_namespaces
async def test_the_model_endpoint_is_reached_on_loopback_when_the_base_url_says_localhost(model_server):
    """The endpoint given to the constructor; OPENAI_BASE_URL naming `localhost` is rewritten to 127.0.0.1."""
    script = (
        'echo "$OPENAI_BASE_URL"; '
        '"$PY" -c "import os, urllib.request; print(urllib.request.urlopen(os.environ[\'OPENAI_BASE_URL\'] '
        '+ \'/models\', timeout=10).read().decode())"'
    )
    async with asyncio.timeout(BOUND_S), make(NamespaceSandbox, endpoint=("localhost", model_server.port)) as box:
        launch = AgentLaunch(
            argv=("sh", "-c", script),
            env={"PY": sys.executable, "OPENAI_BASE_URL": model_server.base_url("localhost")},
            cwd=box.workspace,
        )
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None))
    assert result.ok, result
    assert result.stdout.splitlines()[0] == model_server.base_url()
    assert '"id": "policy"' in result.stdout


@needs_namespaces
async def test_large_requests_and_streamed_replies_cross_the_bridge_whole_on_reused_connections(model_server):
    script = """
import hashlib, http.client, os, sys
body = os.urandom(3 * 1024 * 1024)
connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
for _ in range(3):  # keep-alive: the same forwarded connection carries every request
    connection.request("POST", "/rollout/b/v1/echo", body=body)
    reply = connection.getresponse().read()
    print(hashlib.sha256(reply).hexdigest() == hashlib.sha256(body).hexdigest())
"""
    async with asyncio.timeout(BOUND_S), make(NamespaceSandbox, endpoint=("127.0.0.1", model_server.port)) as box:
        launch = AgentLaunch(argv=(sys.executable, "-c", script, str(model_server.port)), env={}, cwd=box.workspace)
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None))
    assert result.ok, result
    assert result.stdout == "True\nTrue\nTrue\n"


@needs_namespaces
async def test_without_an_endpoint_the_sandbox_has_no_network(other_listener):
    script = (
        '"$PY" -c "import socket, sys; socket.create_connection((\'127.0.0.1\', int(sys.argv[1])), timeout=3)" '
        '"$PORT" 2>/dev/null && echo connected || echo refused'
    )
    async with asyncio.timeout(BOUND_S), make(NamespaceSandbox) as box:
        launch = AgentLaunch(
            argv=("sh", "-c", script), env={"PY": sys.executable, "PORT": str(other_listener.port)}, cwd=box.workspace
        )
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None))
    assert result.stdout == "refused\n"
    assert not other_listener.connected.is_set()


def _escapee(marker: str):
    argv = f"sleep\0{marker}\0".encode()
    return lambda cmdline, environ: cmdline == argv


@needs_namespaces
async def test_an_escaped_background_process_is_gone_after_the_run():
    marker = f"300.{random.randrange(10**6):06d}"  # a sleep no other process on the host runs
    script = f"setsid sleep {marker} & echo up > ready; while [ ! -e go ]; do sleep 0.02; done"
    async with asyncio.timeout(BOUND_S), make(NamespaceSandbox) as box:
        launch = AgentLaunch(argv=("sh", "-c", script), env={}, cwd=box.workspace)
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None)))
        await wait_for_file(box.workspace / "ready")
        assert await wait_until(lambda: host_pids(_escapee(marker)), within_s=5)  # it really was running
        (box.workspace / "go").touch()
        result = await run
    assert result.ok, result
    assert not host_pids(_escapee(marker))


@needs_namespaces
async def test_killing_the_sandbox_process_ends_everything_in_its_namespace():
    """The backstop behind the subreaper: bwrap gone, the PID namespace goes, escaped processes included."""
    marker = f"300.{random.randrange(10**6):06d}"
    script = f"setsid sleep {marker} & echo up > ready; sleep 300"
    async with asyncio.timeout(BOUND_S), make(NamespaceSandbox) as box:
        launch = AgentLaunch(argv=("sh", "-c", script), env={}, cwd=box.workspace)
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None)))
        await wait_for_file(box.workspace / "ready")
        assert await wait_until(lambda: host_pids(_escapee(marker)), within_s=5)
        root = str(box.root).encode()
        bwraps = host_pids(lambda cmdline, _: cmdline.split(b"\0")[0].endswith(b"bwrap") and root in cmdline)
        [bwrap] = [pid for pid in bwraps if parent_of(pid) == os.getpid()]  # the outer one, not its init inside
        os.kill(bwrap, signal.SIGKILL)
        result = await run
        assert result.outcome == "exited" and result.exit_code == 128 + signal.SIGKILL
        assert await wait_until(lambda: not host_pids(_escapee(marker)), within_s=10)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_sandbox_sees_its_own_directories_at_the_paths_it_was_given(backend):
    async with asyncio.timeout(BOUND_S), make(backend) as box:
        (box.bin_dir / "answer").write_text("#!/bin/sh\necho answered \"$@\"\n")
        (box.bin_dir / "answer").chmod(0o700)
        script = 'answer 42; touch "$HOME/h" "$TMPDIR/t" made; pwd'
        launch = AgentLaunch(argv=("sh", "-c", script), env={"HOME": str(box.home)}, cwd=box.workspace)
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None))
        assert result.ok, result
        assert result.stdout == f"answered 42\n{box.workspace}\n"
        assert (box.home / "h").exists() and (box.tmp / "t").exists() and (box.workspace / "made").exists()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ending", ["timeout", "cancelled"])
async def test_a_run_that_is_ended_leaves_no_process_of_its_sandbox_behind(backend, ending):
    marker = f"300.{random.randrange(10**6):06d}"
    script = f"setsid sleep {marker} & echo up > ready; trap '' TERM; sleep 300"
    async with asyncio.timeout(BOUND_S), make(backend) as box:
        launch = AgentLaunch(argv=("sh", "-c", script), env={}, cwd=box.workspace)
        wall_s = 1.0 if ending == "timeout" else BOUND_S
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=wall_s, idle_s=None)))
        await wait_for_file(box.workspace / "ready")
        assert await wait_until(lambda: host_pids(_escapee(marker)), within_s=5)
        if ending == "timeout":
            assert (await run).outcome == "timeout"
        else:
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        assert await wait_until(lambda: not host_pids(_escapee(marker)), within_s=10)
