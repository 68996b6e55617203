"""The replay benchmark's corpus and load generator (bench/replay/, bench/bench_replay.py) hold what its figures
rest on: a session recorded from a real agent (Pi) replays through the gate, copy after copy, as it was recorded:
every prompt found, every answer the recorded one, each copy one main chain with the recorded sampled ids, and
the tool-call ids the gate gave echoed back as an agent would. Skipped when Pi is not installed (scripts/setup-agents.sh); failed instead under CI=true."""

from __future__ import annotations

import asyncio
import gzip
import random

import aiohttp
import orjson
import pytest

from agents.specs.packages import PI
from bench.bench_replay import Population
from bench.peers.launch import DirectTarget, InterceptorTarget
from bench.peers.serving import start_app
from bench.replay.corpus import load_corpus
from bench.replay.record import record_session
from bench.replay.upstream import ReplayModel
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.store.recorder import read_records
from tests.agents.agent_runs import require_agent

pytestmark = pytest.mark.e2e

COPIES = 3


async def replay(population: Population, copies: int) -> None:
    population.measuring = True
    population.active.set()
    await population.grow(1)
    async with asyncio.timeout(120):
        while population.finished < copies:
            await asyncio.sleep(0.05)
    for task in population.tasks:
        task.cancel()
    await asyncio.gather(*population.tasks, return_exceptions=True)


async def test_a_recorded_pi_session_replays_through_the_gate_as_recorded(tiny_model_dir, tmp_path):
    require_agent(PI)
    recorded = await record_session("pi", "click", model=tiny_model_dir, steps=4, window=131072)
    assert (recorded["exit_code"], recorded["record"]["kinds"]) == (0, ["main"])
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "pi-click.json.gz").write_bytes(gzip.compress(orjson.dumps(recorded)))
    (session,) = load_corpus(corpus)
    chats = [r for r in session.requests if r.path == "/chat/completions"]
    assert len(chats) == 5 and all(r.status == 200 for r in chats)  # four steps and the report

    model = ReplayModel(corpus, tiny_model_dir)
    runner, model_url = await start_app(model.app())
    config = ServerConfig(upstream=UpstreamConfig(base_url=model_url), model_dir=tiny_model_dir,
                          admin_token="replay-admin", record_path=tmp_path / "gate.jsonl")
    try:
        async with InterceptionServer(config) as gate, aiohttp.ClientSession() as http:
            direct = Population(DirectTarget("direct", model_url), [session], http, random.Random(1))
            through_gate = Population(InterceptorTarget("gate", gate.url, "replay-admin"), [session], http,
                                      random.Random(1))
            await replay(direct, COPIES)
            await replay(through_gate, COPIES)
    finally:
        await runner.cleanup()

    assert model.misses == 0
    for population in (direct, through_gate):
        assert population.turns and all(t.ok for t in population.turns)
    records = list(read_records(tmp_path / "gate.jsonl"))[:COPIES]  # the copies that ran to the end, first closed
    assert len(records) == COPIES and all(r.status == "ok" for r in records)
    sampled = [c["ids"] for c in recorded["completions"].values()]
    for record in records:
        (sample,) = record.samples  # no fork: the echoed tool-call ids are the ones this gate gave
        assert sample.kind == "main" and len(sample.turns) == len(chats)
        ids = sample.input_ids
        assert [ids[t.completion_start:t.completion_end] for t in sample.turns] == sampled  # as recorded
        given = [e["response"]["tool_calls"][0]["id"] for e in record.trace[:-1]]
        echoed = [e["new_messages"][0]["tool_call_id"] for e in record.trace[1:]]
        assert echoed == given  # each tool result answers the call id this gate gave, as the agent's would
    assert len({r.rollout_id for r in records}) == COPIES  # each copy its own rollout
