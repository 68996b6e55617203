"""Egress allow-lists (`agents.sandbox.egress`): a task's box reaches the destinations its list names, through its
proxy, and nothing else; every refusal is recorded with its destination. Tried from inside a box of every backend
that has a bridge (namespace, Docker, Docker with a daemon that binds nothing), with a real HTTP service on the host,
and end to end: Pi fetching through the proxy in a rollout, the refused destination an event of the rollout."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from aiohttp import web

from agents import PiAgent
from agents.errors import AgentConfigError
from agents.runner import Runner, RunnerConfig
from agents.sandbox import backends
from agents.sandbox.backends import BACKENDS, BoxChooser, Placement
from agents.sandbox.egress import MAX_REFUSALS, EgressPolicy, EgressProxy, proxy_port
from agents.sandbox.supervision import RunLimits
from agents.specs.packages import PI
from agents.specs.spec import AgentLaunch, BoxFile
from agents.tasks import Grader, Task, TaskError
from tests.agents.agent_runs import MAX_MODEL_LEN, bash_call, require_agent
from tests.invariants import assert_token_exact

from .test_backends import IMAGE, _why_not
from .test_swe import server  # noqa: F401  (fixture: a server on port 0 in front of the scripted upstream)

# What a program in the box runs to fetch through its proxy. The box's loopback is the box's own (NO_PROXY names it,
# for the model endpoint): a service on the host's loopback is reached by asking the proxy for it explicitly.
FETCH = r"""
import os, sys, urllib.request
proxy = os.environ["HTTP_PROXY"]
for key in ("no_proxy", "NO_PROXY"):
    os.environ.pop(key, None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
for url in sys.argv[1:]:
    try:
        print(url, "->", opener.open(url, timeout=20).read().decode())
    except Exception as exc:
        print(url, "-> refused:", exc)
"""
DIRECT = r"""
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    print("direct: connected")
except OSError as exc:
    print("direct: refused", exc.errno)
"""


@dataclass
class Service:
    port: int
    seen: list[str]


@pytest.fixture
async def service() -> AsyncIterator[Service]:
    """A test service on the host's loopback that says who asked."""
    seen: list[str] = []

    async def hello(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.Response(text=f"hello-from-service {request.headers.get('Connection', '')}")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield Service(port=site._server.sockets[0].getsockname()[1], seen=seen)
    finally:
        await runner.cleanup()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------------- the list


@pytest.mark.parametrize(("entry", "host", "port", "allowed"), [
    ("pypi.internal:443", "pypi.internal", 443, True),
    ("pypi.internal:443", "PyPI.Internal.", 443, True),
    ("pypi.internal:443", "pypi.internal", 80, False),
    ("pypi.internal", "pypi.internal", 80, True),
    ("pypi.internal", "pypi.internal", 8080, False),
    ("*.mirror.example.org:443", "eu.mirror.example.org", 443, True),
    ("*.mirror.example.org:443", "mirror.example.org", 443, False),
    ("*.mirror.example.org:443", "evilmirror.example.org", 443, False),
    ("10.0.0.7:8080", "10.0.0.7", 8080, True),
    ("[::1]:9000", "::1", 9000, True),
    ("[::1]:9000", "[::1]", 9000, True),
])
def test_a_destination_passes_only_when_an_entry_names_its_host_and_port(entry, host, port, allowed):
    assert (EgressPolicy.parse([entry]).permits(host, port) is not None) is allowed


@pytest.mark.parametrize(("entries", "message"), [
    (["pypi.internal:0"], "port must be 1-65535"),
    (["pypi.internal:http"], "port must be 1-65535"),
    (["bad host:80"], "not a host name or address"),
    (["*.org:443"], "suffix of two labels"),
    (["[pypi]:443"], "not an IPv6 address"),
    (["a.b:80", 3], "list of 'host:port' strings"),
    ("a.b:80", "list of 'host:port' strings"),
])
def test_a_bad_entry_is_refused_naming_it(entries, message):
    with pytest.raises(AgentConfigError, match=message):
        EgressPolicy.parse(entries)


def test_a_task_file_with_a_bad_egress_list_is_refused_naming_the_task():
    with pytest.raises(TaskError, match="task t: egress entry 'x:99999'"):
        Task.from_dict({"id": "t", "instruction": "i", "grader": {"kind": "answer", "expected": "1"},
                        "egress": ["x:99999"]}, base_dir=Path("."))  # fmt: skip
    with pytest.raises(TaskError, match="egress is a list of strings"):
        Task.from_dict({"id": "t", "instruction": "i", "grader": {"kind": "answer", "expected": "1"},
                        "egress": "pypi.internal:443"}, base_dir=Path("."))  # fmt: skip
    with pytest.raises(TaskError, match="an open one reaches everything"):
        Task(id="t", instruction="i", grader=Grader(kind="answer", expected="1"), network="open",
             egress=("pypi.internal:443",))  # fmt: skip


def test_a_box_that_cannot_enforce_the_list_is_refused_and_the_list_is_part_of_the_boxs_kind():
    with pytest.raises(AgentConfigError, match="needs an isolating sandbox, not local"):
        BoxChooser("local", Placement())(None, "model", ("pypi.internal:443",))
    if BACKENDS["namespace"].unavailable() is None:
        choose = BoxChooser("namespace", Placement())
        assert choose(None, "model", ("a.b:1",))[0] != choose(None, "model", ("a.b:2",))[0] != choose()[0]


def test_the_proxy_takes_a_port_of_its_own_beside_the_model_endpoint():
    assert proxy_port(8000) != 8000 and proxy_port(proxy_port(8000)) != proxy_port(8000)


# ------------------------------------------------------------------------------ the host half, alone


async def _ask(path: Path, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()


async def test_the_host_half_lets_listed_destinations_through_and_records_every_other(service, tmp_path):
    policy = EgressPolicy.parse([f"127.0.0.1:{service.port}"])
    async with EgressProxy(tmp_path / "egress.sock", policy) as proxy:
        plain = await _ask(proxy.path, f"GET http://127.0.0.1:{service.port}/a?b=1 HTTP/1.1\r\nHost: x\r\n"
                                       "Proxy-Connection: keep-alive\r\n\r\n".encode())  # fmt: skip
        assert plain.startswith(b"HTTP/1.1 200") and b"hello-from-service close" in plain
        assert service.seen == ["/a?b=1"]  # sent on in origin form, one request per connection

        tunnel = await _ask(proxy.path, f"CONNECT 127.0.0.1:{service.port} HTTP/1.1\r\n\r\n"
                                        "GET /tunnelled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert tunnel.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200")
        assert service.seen[-1] == "/tunnelled"

        closed = _closed_port()
        for request in (f"GET http://127.0.0.1:{closed}/ HTTP/1.1\r\n\r\n", f"CONNECT example.org:443 HTTP/1.1\r\n\r\n",
                        f"GET http://localhost:{service.port}/ HTTP/1.1\r\n\r\n"):
            assert (await _ask(proxy.path, request.encode())).startswith(b"HTTP/1.1 403")
        assert [(r.host, r.port) for r in proxy.refusals] == [("127.0.0.1", closed), ("example.org", 443),
                                                             ("localhost", service.port)]  # fmt: skip
        assert proxy.passed == 2 and len(service.seen) == 2


@pytest.mark.parametrize("request_bytes", [
    b"not http at all\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not a proxy request
    b"GET https://a.b/ HTTP/1.1\r\n\r\n",  # TLS goes by CONNECT
    b"GET http://user:pw@a.b/ HTTP/1.1\r\n\r\n",
    b"CONNECT a.b HTTP/1.1\r\n\r\n",  # no port
])
async def test_what_is_not_a_proxy_request_gets_a_400_and_reaches_nothing(service, tmp_path, request_bytes):
    async with EgressProxy(tmp_path / "egress.sock", EgressPolicy.parse(["a.b"])) as proxy:
        assert (await _ask(proxy.path, request_bytes)).startswith(b"HTTP/1.1 400")
        assert proxy.passed == 0 and proxy.refusals == []


def _own_addresses() -> list[str]:
    """Addresses this host answers on: loopback (also IPv4-mapped) and each interface's first IPv4 address."""
    found = ["127.0.0.1", "::ffff:127.0.0.1"]
    for name, addresses in sorted(psutil.net_if_addrs().items()):
        found += [a.address for a in addresses if a.family == socket.AF_INET and a.address not in found][:1]
    return found


@pytest.mark.parametrize("address", _own_addresses())
async def test_a_listed_name_that_resolves_to_this_host_is_refused(service, tmp_path, monkeypatch, address):
    """A wildcard the box can point anywhere (or a name rebound to one of this host's addresses) must not reach the
    host's own services, the interception server's admin routes among them; a loopback address named literally
    may."""
    real = socket.getaddrinfo

    def rebound(host, port, *args, **kwargs):
        if host.endswith("mirror.example.org"):
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (address, port) if family == socket.AF_INET
                     else (address, port, 0, 0))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    policy = EgressPolicy.parse([f"*.mirror.example.org:{service.port}", f"localhost:{service.port}"])
    async with EgressProxy(tmp_path / "egress.sock", policy) as proxy:
        reply = await _ask(proxy.path, f"GET http://eu.mirror.example.org:{service.port}/ HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 403") and b"this host's own address" in reply
        assert service.seen == []
        reply = await _ask(proxy.path, f"GET http://localhost:{service.port}/named HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 200") and service.seen == ["/named"]
        assert [r.host for r in proxy.refusals] == ["eu.mirror.example.org"]


async def test_refusals_past_the_cap_are_counted_not_kept(tmp_path):
    async with EgressProxy(tmp_path / "egress.sock", EgressPolicy.parse(["a.b:1"])) as proxy:
        for port in range(2, MAX_REFUSALS + 12):
            await _ask(proxy.path, f"CONNECT c.d:{port} HTTP/1.1\r\n\r\n".encode())
        assert proxy.refused == MAX_REFUSALS + 10 and len(proxy.refusals) == MAX_REFUSALS


# ------------------------------------------------------------------------------- from inside each box


def _box(name: str, egress: tuple[str, ...], monkeypatch):
    if name.startswith("docker"):
        monkeypatch.setattr(backends, "_daemon_elsewhere", lambda: name == "docker-remote")
    image = IMAGE if name.startswith("docker") else None
    key, make = BoxChooser("auto" if image else name, Placement())(image, "model", egress)
    assert key[0] == name
    return make()


@pytest.mark.parametrize("name", ["namespace", "docker", "docker-remote"])
async def test_from_inside_each_box_a_listed_service_answers_and_an_unlisted_one_is_refused(name, service,
                                                                                            monkeypatch):
    if (reason := _why_not(name)) is not None:
        pytest.skip(f"{name} backend: {reason}")
    other = _closed_port()
    async with _box(name, (f"127.0.0.1:{service.port}",), monkeypatch) as box:
        await box.put_files((BoxFile(box.workspace / "fetch.py", FETCH.encode(), 0o644),
                             BoxFile(box.workspace / "direct.py", DIRECT.encode(), 0o644)))
        result = await box.run(
            _launch(box, f"python3 fetch.py http://127.0.0.1:{service.port}/ok http://127.0.0.1:{other}/no "
                         f"http://example.org/ && python3 direct.py {service.port}"),
            limits=_LIMITS)  # fmt: skip
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[0].endswith("-> hello-from-service close"), result.stdout
    assert "refused: HTTP Error 403" in lines[1] and "refused: HTTP Error 403" in lines[2], result.stdout
    assert lines[3].startswith("direct: refused"), result.stdout  # no route but the proxy: the box's loopback
    assert service.seen == ["/ok"]
    assert result.egress_refused == (("127.0.0.1", other, "not on the task's egress list"),
                                     ("example.org", 80, "not on the task's egress list"))  # fmt: skip
    assert dict(result.limits_hit)["egress"] == 2


_LIMITS = RunLimits(wall_s=120, idle_s=None)


def _launch(box, command: str) -> AgentLaunch:
    return AgentLaunch(argv=("/bin/sh", "-c", f"exec 2>&1; {command}"), env={}, cwd=box.workspace)


# ------------------------------------------------------------------------------------------ a rollout


@pytest.mark.e2e
async def test_pi_fetches_through_the_proxy_and_the_refused_destination_is_an_event_of_its_rollout(
    server, scripted, service  # noqa: F811
):
    if BACKENDS["namespace"].unavailable() is not None:
        pytest.fail("the namespace sandbox is needed: run scripts/setup-sandbox.sh")
    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    other = _closed_port()
    task = Task(id="fetch", instruction="Fetch the service's greeting into greeting.txt.",
                files={"fetch.py": FETCH}, egress=(f"127.0.0.1:{service.port}",),
                grader=Grader(kind="command", command="grep -q 'hello-from-service' greeting.txt"))  # fmt: skip
    scripted.script(bash_call(f"python3 fetch.py http://127.0.0.1:{service.port}/greeting "
                              f"http://127.0.0.1:{other}/ > greeting.txt; cat greeting.txt"), "Done.")
    async with asyncio.timeout(180):
        (record,) = await Runner(server, RunnerConfig(agent=pi)).run_tasks([task], n=1)
    assert (record.status, record.reward) == ("ok", 1.0), (record.failure, record.events)
    assert service.seen == ["/greeting"]
    refused = [event for event in record.events if event["kind"] == "egress_refused"]
    assert [(event["host"], event["port"]) for event in refused] == [("127.0.0.1", other)]
    assert_token_exact(record, scripted.calls)


def test_the_run_command_refuses_a_task_whose_list_its_sandbox_cannot_enforce(tmp_path):
    import subprocess

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "t", "instruction": "i", "grader": {"kind": "answer", "expected": "1"}, '
                     '"egress": ["pypi.internal:443"]}\n')
    done = subprocess.run([sys.executable, "-m", "interceptor.cli", "run", "--tasks", str(tasks), "--sandbox", "local",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "task t: a task with an egress list needs an isolating sandbox, not local" in done.stderr, done.stderr
    assert not (tmp_path / "out" / "rollouts.jsonl").exists()
