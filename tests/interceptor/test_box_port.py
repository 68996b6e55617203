"""The box port (`interceptor/box_port.py`): the rollout routes alone, on an address other than the server's own, for
boxes off this host's loopback. Each rollout's routes answer its own secret only; the admin API, /metrics, /health
and mounted pages are not there at all; an address is listened on while someone uses it."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import aiohttp
import openai
import pytest

from interceptor.config import ServerConfig, UpstreamConfig
from interceptor.errors import ConfigError
from interceptor.server import InterceptionServer

ADMIN = "admin-token-for-the-box-port-tests"
BOX_HOST = "127.0.0.2"  # another loopback address: a listener of its own, as a container network's gateway is


@pytest.fixture
async def server(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          max_model_len=4096, admin_token=ADMIN)  # fmt: skip
    async with InterceptionServer(config) as server:
        yield server


async def _status(session: aiohttp.ClientSession, method: str, url: str, **kwargs) -> int:
    async with session.request(method, url, **kwargs) as response:
        await response.read()
        return response.status


async def test_a_rollout_turns_through_the_box_port_with_its_own_secret(server, scripted):
    box = await server.box_port.expose(BOX_HOST)
    assert box.startswith(f"http://{BOX_HOST}:") and box != server.url
    handle = server.open_rollout()
    scripted.script("hello from the box port")
    client = openai.AsyncOpenAI(base_url=f"{box}/rollout/{handle.id}/v1", api_key=handle.secret, max_retries=0)
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "hello from the box port"
    record = await server.finish_rollout(handle.id)
    assert len(record.trace) == 1 and record.trace[0]["new_messages"][0]["content"] == "hi"


async def test_the_box_port_has_no_admin_api_metrics_health_or_pages(server):
    box = await server.box_port.expose(BOX_HOST)
    handle = server.open_rollout()
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as session:
        # on the server's own port the admin token opens these ...
        assert await _status(session, "GET", f"{server.url}/rollouts/{handle.id}", headers=headers) == 200
        assert await _status(session, "GET", f"{server.url}/health") == 200
        # ... on the box port they do not exist
        for method, path in [("GET", f"/rollouts/{handle.id}"), ("POST", "/rollouts"),
                             ("POST", f"/rollouts/{handle.id}/finish"), ("GET", "/metrics"), ("GET", "/health"),
                             ("GET", "/")]:  # fmt: skip
            assert await _status(session, method, f"{box}{path}", headers=headers) == 404, path
        # the rollout's own routes are there, behind its secret
        models = f"{box}/rollout/{handle.id}/v1/models"
        assert await _status(session, "GET", models, headers={"Authorization": f"Bearer {handle.secret}"}) == 200
        assert await _status(session, "GET", models, headers=headers) == 401  # the admin token is no rollout secret
        assert await _status(session, "GET", models) == 401


async def test_one_rollouts_secret_opens_no_other_rollout_on_the_box_port(server):
    box = await server.box_port.expose(BOX_HOST)
    mine, theirs = server.open_rollout(), server.open_rollout()
    async with aiohttp.ClientSession() as session:
        status = await _status(session, "GET", f"{box}/rollout/{theirs.id}/v1/models",
                               headers={"Authorization": f"Bearer {mine.secret}"})  # fmt: skip
        assert status == 401
        status = await _status(session, "POST", f"{box}/rollout/{theirs.id}/v1/chat/completions",
                               headers={"Authorization": f"Bearer {mine.secret}"},
                               json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert status == 401


async def test_an_address_is_listened_on_until_its_last_user_withdraws(server):
    first = await server.box_port.expose(BOX_HOST)
    assert await server.box_port.expose(BOX_HOST) == first  # the same address and port, counted twice
    handle = server.open_rollout()
    headers = {"Authorization": f"Bearer {handle.secret}"}
    models = f"{first}/rollout/{handle.id}/v1/models"
    async with aiohttp.ClientSession() as session:
        await server.box_port.withdraw(BOX_HOST)
        assert await _status(session, "GET", models, headers=headers) == 200  # one user left
        await server.box_port.withdraw(BOX_HOST)
        assert server.box_port.addresses == ()
    async with aiohttp.ClientSession() as session:  # a new connection: nothing listens there now
        with pytest.raises(aiohttp.ClientConnectorError):
            await _status(session, "GET", models, headers=headers)
        # another address later gets the same port number
        again = await server.box_port.expose("127.0.0.3")
        assert again.rsplit(":", 1)[1] == first.rsplit(":", 1)[1]


async def test_box_listen_listens_for_the_servers_life_and_box_url_is_what_boxes_are_told(scripted, tiny_model_dir):
    base = dict(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, max_model_len=4096)
    async with InterceptionServer(ServerConfig(**base, box_listen=f"{BOX_HOST}:0")) as server:
        url = server.box_port.url
        assert url is not None and url.startswith(f"http://{BOX_HOST}:") and server.box_port.addresses == (BOX_HOST,)
        handle = server.open_rollout()
        async with aiohttp.ClientSession() as session:
            status = await _status(session, "GET", f"{url}/rollout/{handle.id}/v1/models",
                                   headers={"Authorization": f"Bearer {handle.secret}"})  # fmt: skip
            assert status == 200
    config = ServerConfig(**base, box_listen=f"{BOX_HOST}:0", box_url="https://boxes.example.org/")
    async with InterceptionServer(config) as server:
        assert server.box_port.url == "https://boxes.example.org"
    async with InterceptionServer(ServerConfig(**base)) as server:
        assert server.box_port.url is None and server.box_port.addresses == ()


@pytest.mark.parametrize(("fields", "message"), [
    ({"box_listen": "127.0.0.2"}, "box_listen is HOST:PORT"),
    ({"box_listen": "127.0.0.2:99999"}, "box_listen is HOST:PORT"),
    ({"box_url": "http://boxes.example.org"}, "give box_listen too"),
    ({"box_listen": "0.0.0.0:0", "box_url": "boxes.example.org"}, "http(s) URL"),
])  # fmt: skip
def test_a_bad_box_address_is_refused_with_the_reason(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ServerConfig(upstream=UpstreamConfig(base_url="http://127.0.0.1:1"), mode="black_box", **fields)


async def test_an_address_that_cannot_be_listened_on_is_a_clear_error(server):
    with pytest.raises(ConfigError, match="the box port cannot listen on 192.0.2.1"):
        await server.box_port.expose("192.0.2.1")  # TEST-NET-1: no interface of this host has it


def _serve_argv(upstream: str, model_dir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "interceptor.cli", "serve", "--upstream", upstream, "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", "0", *extra]  # fmt: skip


def test_serve_with_workers_refuses_box_listen_saying_why(tiny_model_dir):
    done = subprocess.run(_serve_argv("http://127.0.0.1:1", tiny_model_dir, "--workers", "2", "--box-listen",
                                      f"{BOX_HOST}:0"), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "--box-listen serves one server's rollouts" in done.stderr


async def test_serve_prints_where_boxes_reach_the_rollout_routes(scripted, tiny_model_dir):
    process = await asyncio.create_subprocess_exec(
        *_serve_argv(scripted.url, tiny_model_dir, "--box-listen", f"{BOX_HOST}:0"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with asyncio.timeout(120):
            lines = [(await process.stdout.readline()).decode() for _ in range(2)]
        assert "listening on http://127.0.0.1:" in lines[0]
        assert re.search(rf"box port\) on http://{re.escape(BOX_HOST)}:\d+$", lines[1].strip()), lines
    finally:
        process.terminate()
        await process.wait()
