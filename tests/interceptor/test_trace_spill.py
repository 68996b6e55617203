"""A journaled rollout keeps its trace in the journal, not in memory, and its record still has every entry."""

from __future__ import annotations

import re

import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.journal import Journal, JournalError
from tests.fakes import ScriptedUpstream
from tests.interceptor.test_trajectories import TOOLS, call_text, echo


class _ChatUpstream:
    """An OpenAI-compatible upstream that answers every chat call with a tool call (black_box relays to it)."""

    def __init__(self) -> None:
        self.calls = 0
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> _ChatUpstream:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._runner.cleanup()

    def script(self, text: str) -> None:
        pass  # every answer is a call of its own

    async def _chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        call = {"id": f"call_{self.calls}", "type": "function",
                "function": {"name": "bash", "arguments": orjson.dumps({"cmd": f"ls {self.calls}"}).decode()}}
        return web.json_response({
            "id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                         "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })


async def _tool_loop(model_dir, record_path, *, mode: str = "interception_gate"):
    """Four tool-loop turns and a finish; the record, and how many entries the rollout held just before it."""
    upstream_cm = ScriptedUpstream(model_dir) if mode == "interception_gate" else _ChatUpstream()
    async with upstream_cm as upstream:
        config = ServerConfig(upstream=UpstreamConfig(base_url=upstream.url), model_dir=model_dir, mode=mode,
                              record_path=record_path)
        async with InterceptionServer(config) as server:
            handle = server.open_rollout()
            messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
            async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
                for step in range(4):
                    upstream.script(call_text(f"ls {step}"))
                    response = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
                    messages.append(echo(response.choices[0].message))
                    call_id = response.choices[0].message.tool_calls[0].id
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": f"out {step}"})
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
    with pytest.raises(JournalError, match="journal segment"):
        journal.traces("a", [(number, offset + 1, length)])
    journal.close(remove=True)
