"""Each rollout is written to the record file exactly once, and one server at a time writes a record file.

A kill -9 between a finished rollout's record reaching the file and its `finish` line reaching the journal leaves
the rollout unfinished in the journal: recovery must see the record and not write the rollout again as
`interrupted`. A second server on the same record file would recover the first one's live rollouts and delete the
journal segment it is writing: it is refused at start, and the first goes on untouched.

Servers are real (in this process, or `interceptor serve` as a child), in front of the scripted upstream; the crash
state is the bytes a real server left on disk at the moment of the crash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import Counter
from pathlib import Path

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig, read_records
from interceptor.errors import ConfigError
from interceptor.store.journal import journal_segments, recover_journal
from interceptor.store.recorder import Recorder, recorded_ids
from interceptor.store.records import RolloutRecord
from tests.interceptor.serve_process import Conversation, ServeProcess

TEST_TIMEOUT_S = 120.0  # a bound on every wait below
KILLS = 5
AGENTS = 6  # concurrent rollouts, each opened, talked through and finished in a loop until the kill
KILL_AFTER_S = (0.2, 1.2)  # how long the agents run before each kill


def config_for(scripted, model_dir: Path, record_path: Path) -> ServerConfig:
    return ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=model_dir, record_path=record_path)


async def chat(base_url: str, secret: str, turns: int) -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "a task"}]
    async with AsyncOpenAI(base_url=base_url, api_key=secret, max_retries=0) as client:
        for turn in range(turns):
            completion = await client.chat.completions.create(model="policy", messages=messages)
            messages.append({"role": "assistant", "content": completion.choices[0].message.content})
            messages.append({"role": "user", "content": f"go on ({turn})"})


def counted(record_path: Path) -> tuple[Counter, dict[str, RolloutRecord]]:
    records = list(read_records(record_path))
    return Counter(r.rollout_id for r in records), {r.rollout_id: r for r in records}


def turns(record: RolloutRecord) -> int:
    return sum(len(sample.turns) for sample in record.samples)


# ----------------------------------------------------------------------------------------- recovery


async def test_recovery_skips_a_rollout_already_in_the_record_file(scripted, tiny_model_dir, record_path, caplog):
    config = config_for(scripted, tiny_model_dir, record_path)
    async with InterceptionServer(config) as server:
        finished, live = server.open_rollout(), server.open_rollout()
        await asyncio.gather(chat(finished.base_url, finished.secret, 2), chat(live.base_url, live.secret, 2))
        journal = {segment: segment.read_bytes() for segment in journal_segments(record_path)}
        await server.finish_rollout(finished.id, reward=1.0)
        records = record_path.read_bytes()  # fsynced before finish_rollout returned
    # What a kill -9 right after the record's fsync leaves: the record in the file, no finish line in the journal.
    assert journal and all(b'"e":"finish"' not in data for data in journal.values())
    record_path.write_bytes(records)
    for segment, data in journal.items():
        segment.write_bytes(data)

    assert [r.rollout_id for r in recover_journal(record_path)] == [live.id]
    with caplog.at_level(logging.WARNING, logger="interceptor.store.journal"):
        async with InterceptionServer(config):
            pass
    assert "1 rollouts unfinished in the journal are already in" in caplog.text

    times, by_id = counted(record_path)
    assert times == {finished.id: 1, live.id: 1}
    assert by_id[finished.id].status == "ok" and by_id[finished.id].reward == 1.0
    assert by_id[live.id].status == "interrupted" and by_id[live.id].reward is None and turns(by_id[live.id]) == 2
    assert journal_segments(record_path) == []


async def test_recorded_ids_reads_each_line_head_and_parses_other_layouts_whole(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    recorder = Recorder(path)
    for rollout_id in ("a1", "b2"):
        await recorder.write(RolloutRecord(rollout_id=rollout_id, mode="black_box", status="ok", samples=[],
                                           trace=[], usage={}))
    other = RolloutRecord(rollout_id="c3", mode="black_box", status="ok", samples=[], trace=[], usage={})
    reordered = {"schema": other.schema, **other.to_json_dict()}  # the id not first: another tool wrote it
    escaped = RolloutRecord(rollout_id='d"4', mode="black_box", status="ok", samples=[], trace=[], usage={})
    with open(path, "ab") as f:
        f.write(orjson.dumps(reordered) + b"\n" + escaped.to_json() + b"\n\n" + b'{"rollout_id":"e5","mo')
    assert recorded_ids(path) == {"a1", "b2", "c3", 'd"4'}  # the torn last line holds no record


async def test_kill_9_under_concurrent_rollouts_writes_each_rollout_exactly_once(
    scripted, launch, tiny_model_dir, record_path
):
    rng = random.Random(0)
    acknowledged: dict[str, float] = {}  # finished, the answer received: reward
    opened: set[str] = set()  # the 201 received

    async def agent(server: ServeProcess, session: aiohttp.ClientSession) -> None:
        try:
            while True:
                conversation = Conversation(await server.open_rollout(session))
                rollout_id = conversation.rollout["id"]
                opened.add(rollout_id)
                for _ in range(rng.randint(1, 2)):
                    await conversation.turn(session)
                reward = rng.choice((0.0, 0.5, 1.0))
                await server.finish_rollout(session, rollout_id, reward=reward)
                acknowledged[rollout_id] = reward
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            pass  # the server was killed

    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        for _ in range(KILLS):
            async with launch() as server:  # each start after the first recovers what the kill left
                agents = [asyncio.create_task(agent(server, session)) for _ in range(AGENTS)]
                await asyncio.sleep(rng.uniform(*KILL_AFTER_S))
                await server.kill()
                await asyncio.gather(*agents)
        # the last restart, in this process: the same recovery, without another interpreter's start-up
        async with InterceptionServer(config_for(scripted, tiny_model_dir, record_path)):
            pass

    times, by_id = counted(record_path)
    assert [rid for rid, n in times.items() if n > 1] == []
    assert acknowledged and opened <= set(times)
    assert {rid: (by_id[rid].status, by_id[rid].reward) for rid in acknowledged} == {
        rid: ("ok", reward) for rid, reward in acknowledged.items()
    }
    assert {r.status for r in by_id.values()} <= {"ok", "interrupted"}
    print(f"\n{KILLS} kills: {len(acknowledged)} rollouts finished, {len(by_id) - len(acknowledged)} interrupted, "
          "each written once")


# ------------------------------------------------------------------------------------ one server per file


async def test_second_server_on_the_same_record_file_is_refused(scripted, tiny_model_dir, record_path):
    config = config_for(scripted, tiny_model_dir, record_path)
    async with InterceptionServer(config) as first:
        handle = first.open_rollout()
        await chat(handle.base_url, handle.secret, 1)
        with pytest.raises(ConfigError) as refused:
            async with InterceptionServer(config):
                pass
        message = str(refused.value)
        assert f"another server (pid {os.getpid()}) is writing the record file {record_path}" in message
        await chat(handle.base_url, handle.secret, 1)  # the first's journal was not touched: its rollout goes on
        record = await first.finish_rollout(handle.id, reward=1.0)
        assert record.status == "ok" and turns(record) == 2

    async with InterceptionServer(config) as after:  # the file is free once the first has closed
        later = after.open_rollout()
        await after.finish_rollout(later.id, reward=0.5)

    times, by_id = counted(record_path)
    assert times == {handle.id: 1, later.id: 1}
    assert by_id[handle.id].status == "ok" and by_id[handle.id].reward == 1.0 and turns(by_id[handle.id]) == 2


async def test_a_second_serve_process_on_the_same_record_file_exits_naming_the_file_and_the_holder(
    scripted, launch, record_path
):
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        async with launch() as first:
            conversation = Conversation(await first.open_rollout(session))
            await conversation.turn(session)
            with pytest.raises(AssertionError) as refused:  # it exits without listening; its stderr is the message
                async with launch():
                    pass
            said = str(refused.value)
            assert (f"interceptor serve: error: another server (pid {first.process.pid}) is writing the record "
                    f"file {record_path}") in said
            assert "Traceback" not in said  # the reason, not a traceback
            await conversation.turn(session)
            record = await first.finish_rollout(session, conversation.rollout["id"], reward=1.0)
            assert await first.terminate() == 0, first.stderr_tail()

    times, by_id = counted(record_path)
    assert times == {record["rollout_id"]: 1}
    assert by_id[record["rollout_id"]].status == "ok" and turns(by_id[record["rollout_id"]]) == 2
