"""`interceptor serve --workers 2`: rollouts shared between two worker processes behind one admin front.

The server runs as a real child process (tests/interceptor/serve_process.py) in front of the scripted upstream, and
spawns its two workers itself. Rollouts are opened and finished through the front; agents (the real `openai` SDK)
talk to the base URL they were given, which names their worker's port. Each worker records to its own file beside
the configured one (`rollouts.w0.jsonl`, `rollouts.w1.jsonl`), and every turn recorded there is checked against the
upstream call that sampled it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from openai import AsyncOpenAI

from interceptor import RolloutRecord, read_records
from interceptor.workers import worker_record_path
from tests.interceptor.serve_process import ServeProcess
from tests.invariants import assert_token_exact

TEST_TIMEOUT_S = 120.0  # a bound on every wait below; each test takes a few seconds
WORKERS = 2


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


async def chat(rollout: dict, turns: int) -> None:
    """`turns` chat calls through the SDK, each with the whole history, as an agent makes them."""
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"task {rollout['id']}"}]
    async with AsyncOpenAI(base_url=rollout["base_url"], api_key=rollout["secret"], max_retries=0) as client:
        for turn in range(turns):
            completion = await client.chat.completions.create(model="policy", messages=messages)
            messages.append({"role": "assistant", "content": completion.choices[0].message.content})
            messages.append({"role": "user", "content": f"go on ({turn})"})


async def call(session: aiohttp.ClientSession, method: str, url: str, token: str, **kwargs) -> tuple[int, dict]:
    async with session.request(method, url, headers={"Authorization": f"Bearer {token}"}, **kwargs) as response:
        return response.status, await response.json()


async def health(session: aiohttp.ClientSession, server: ServeProcess) -> dict:
    async with session.get(f"{server.url}/health") as response:
        return await response.json()


def records_by_worker(record_path: Path) -> list[dict[str, RolloutRecord]]:
    return [{r.rollout_id: r for r in read_records(worker_record_path(record_path, i))} for i in range(WORKERS)]


def ids_by_worker(rollouts: list[dict], status: dict) -> list[set[str]]:
    """Which worker holds each rollout, from the port its base URL names."""
    ports = [port_of(row["url"]) for row in status["workers"]]
    return [{r["id"] for r in rollouts if port_of(r["base_url"]) == port} for port in ports]


@pytest.fixture
def launch(launch):
    """The conftest's `launch`, with the workers."""
    return functools.partial(launch, workers=WORKERS)


async def test_rollouts_are_shared_between_workers_and_each_worker_records_its_own(scripted, launch, record_path):
    scripted.script(*(f"reply {n}" for n in range(8)))
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        async with launch() as server:
            rollouts = [await server.open_rollout(session) for _ in range(4)]
            per_port = Counter(port_of(r["base_url"]) for r in rollouts)
            assert sorted(per_port.values()) == [2, 2], per_port  # two workers, two rollouts each
            assert port_of(server.url) not in per_port  # agents talk to their worker, not through the front
            status = await health(session, server)
            assert status["status"] == "ok" and status["workers_up"] == WORKERS
            assert [row["live_rollouts"] for row in status["workers"]] == [2, 2]
            holders = ids_by_worker(rollouts, status)

            await asyncio.gather(*(chat(r, turns=2) for r in rollouts))
            finished = [await server.finish_rollout(session, r["id"], reward=0.5) for r in rollouts]
            assert [(f["rollout_id"], f["status"], f["reward"]) for f in finished] == [
                (r["id"], "ok", 0.5) for r in rollouts
            ]
            # after the finish the front still routes the id: its worker says it finished, as a single server does
            code, shown = await call(session, "GET", f"{server.url}/rollouts/{rollouts[0]['id']}", server.admin_token)
            assert code == 200 and shown["finished"] is True and shown["status"] == "ok"
            assert (await health(session, server))["live_rollouts"] == 0
            assert await server.terminate() == 0, server.stderr_tail()

    assert not record_path.exists()  # with workers, only the per-worker files are written
    returned = {f["rollout_id"]: RolloutRecord.from_json_dict(f) for f in finished}
    for index, records in enumerate(records_by_worker(record_path)):
        assert set(records) == holders[index], f"worker {index}'s file"
        for record in records.values():
            assert record == returned[record.rollout_id]  # what the front returned is what the worker wrote
            assert record.status == "ok" and record.reward == 0.5
            assert sum(len(sample.turns) for sample in record.samples) == 2
            assert_token_exact(record, scripted.calls)
    assert len(scripted.calls) == 8


async def test_sigterm_stops_the_front_then_every_worker_writes_its_live_rollouts_as_interrupted(
    scripted, launch, record_path
):
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        async with launch() as server:
            rollouts = [await server.open_rollout(session) for _ in range(4)]
            await asyncio.gather(*(chat(r, turns=1) for r in rollouts))
            holders = ids_by_worker(rollouts, await health(session, server))
            assert await server.terminate() == 0, server.stderr_tail()

    for index, records in enumerate(records_by_worker(record_path)):
        assert set(records) == holders[index] and len(records) == 2, f"worker {index}'s file"
        for record in records.values():
            assert record.status == "interrupted" and record.reward is None
            assert record.failure is not None and record.failure.cause == "interrupted"
            assert sum(len(sample.turns) for sample in record.samples) == 1
            assert_token_exact(record, scripted.calls)


async def test_the_front_answers_like_the_admin_api_and_routes_around_a_dead_worker(scripted, launch):
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        async with launch() as server:
            url, token = server.url, server.admin_token
            code, body = await call(session, "GET", f"{url}/rollouts/no-such-rollout", token)
            assert code == 404 and body["error"]["type"] == "not_found_error" and body["error"]["code"] == "not_found"
            code, body = await call(session, "POST", f"{url}/rollouts/no-such-rollout/finish", token, json={})
            assert code == 404 and body["error"]["code"] == "not_found"
            code, body = await call(session, "POST", f"{url}/rollouts", "wrong-token", json={})
            assert code == 401 and body["error"] == {"message": "invalid admin token", "type": "authentication_error",
                                                     "param": None, "code": "invalid_api_key"}
            code, body = await call(session, "POST", f"{url}/rollouts", token, json={"sampling": {"top_p": 7}})
            assert code == 400 and body["error"]["param"] == "sampling"  # the worker's validation, passed on as is

            rollouts = [await server.open_rollout(session) for _ in range(2)]
            status = await health(session, server)
            holders = ids_by_worker(rollouts, status)
            dead = status["workers"][1]
            os.kill(dead["pid"], signal.SIGKILL)
            while (status := await health(session, server))["workers_up"] == WORKERS:
                await asyncio.sleep(0.05)
            assert status["status"] == "degraded" and [row["up"] for row in status["workers"]] == [True, False]
            assert status["workers"][1]["live_rollouts"] == 1  # the rollout it held when it died

            (lost,) = holders[1]
            code, body = await call(session, "GET", f"{url}/rollouts/{lost}", token)
            assert code == 503 and body["error"]["code"] == "worker_unavailable"
            for _ in range(2):  # opening avoids the dead worker
                assert port_of((await server.open_rollout(session))["base_url"]) == port_of(status["workers"][0]["url"])
            assert await server.terminate() == 0, server.stderr_tail()
