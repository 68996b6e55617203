"""A journaled rollout keeps its trace in the journal, not in memory, and its record still has every entry."""

from __future__ import annotations

import re

import orjson
import pytest
from transformers import AutoTokenizer
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.store.journal import Journal, JournalError
from tests.fakes import ScriptedUpstream
from tests.faults.upstream import FaultUpstream, Reply
from tests.interceptor.test_trajectories import TOOLS, call_text, echo


async def _tool_loop(model_dir, record_path, *, mode: str = "interception_gate"):
    """Four tool-loop turns and a finish; the record, and how many entries the rollout held just before it."""
    gate = mode == "interception_gate"
    upstream_cm = ScriptedUpstream(model_dir) if gate else FaultUpstream(AutoTokenizer.from_pretrained(model_dir))
    async with upstream_cm as upstream:
        config = ServerConfig(upstream=UpstreamConfig(base_url=upstream.url), model_dir=model_dir, mode=mode,
                              record_path=record_path)
        async with InterceptionServer(config) as server:
            handle = server.open_rollout()
            messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
            async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
                for step in range(4):
                    upstream.script(call_text(f"ls {step}") if gate else Reply(text=f"answer {step}"))
                    response = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
                    messages.append(echo(response.choices[0].message))
                    if gate:  # the policy's answer is a tool call; the relayed upstream answers in text
                        call_id = response.choices[0].message.tool_calls[0].id
                        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"out {step}"})
                    else:
                        messages.append({"role": "user", "content": f"out {step}"})
            rollout = server.registry.get(handle.id)
            held = len(list(rollout.trace.held_from_last(len(rollout.trace))))
            turns = len(rollout.trace)
            record = await server.finish_rollout(handle.id)
            return record, held, turns


def _same_ids(trace: list[dict]) -> str:
    return re.sub(r"call_[0-9a-zA-Z]+", "call_", orjson.dumps(trace).decode())


@pytest.mark.parametrize("mode", ["interception_gate", "black_box"])
async def test_a_journaled_rollout_holds_no_trace_entry_and_its_record_has_each_one(tiny_model_dir, tmp_path, mode):
    journaled, held, turns = await _tool_loop(tiny_model_dir, tmp_path / "rollouts.jsonl", mode=mode)
    in_memory, held_without, _ = await _tool_loop(tiny_model_dir, None, mode=mode)
    assert turns == 4 and held == 0 and held_without == 4
    assert len(journaled.trace) == 4
    # read back from the journal: the entries memory would have held (tool call ids are drawn afresh each run)
    assert _same_ids(journaled.trace) == _same_ids(in_memory.trace)
    assert journaled.trace[3]["new_messages"][-1]["content"] == "out 2"


def test_traces_are_read_back_across_segments_and_past_other_rollouts_lines(tmp_path):
    journal = Journal(tmp_path / "rollouts.jsonl", segment_bytes=150)  # a new segment every line or two
    spots = {"a": [], "b": []}
    for rollout in spots:
        journal.opened(rollout_id=rollout, mode="black_box", metadata={}, started_at=0.0)
    for n in range(6):
        for rollout, entries in spots.items():
            entries.append(journal.trace(rollout, trace={"n": n, "of": rollout}, usage=(n, n)))
        if n == 2:
            journal.opened(rollout_id="c", mode="black_box", metadata={}, started_at=0.0)
            journal.finished("c")  # a line that is no one's turn, between theirs
    assert len({number for number, _, _ in spots["a"]}) > 2
    journal.finished("b")
    assert journal.traces("a", spots["a"]) == [{"n": n, "of": "a"} for n in range(6)]
    journal.close(remove=True)


def test_a_trace_that_is_not_where_the_rollout_says_is_a_journal_error(tmp_path):
    journal = Journal(tmp_path / "rollouts.jsonl")
    journal.opened(rollout_id="a", mode="black_box", metadata={}, started_at=0.0)
    number, offset, length = journal.trace("a", trace={"n": 0}, usage=(0, 0))
    with pytest.raises(JournalError, match="no turn of rollout b"):
        journal.traces("b", [(number, offset, length)])
    with pytest.raises(JournalError, match="no turn of rollout a"):
        journal.traces("a", [(number, offset + 1, length)])
    (tmp_path / "rollouts.jsonl.journal.000001").unlink()
    with pytest.raises(JournalError, match="No such file"):
        journal.traces("a", [(number, offset, length)])
    journal.close(remove=True)
