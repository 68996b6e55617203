"""A rollout's chains as one tree: sub-agents, compaction, side calls and concurrent turns each placed under their
parent, every sampled token trained exactly once, and the audit that fails a record breaking that.

Through the real server and the real openai SDK against the scripted policy server, with the real tokenizer and
chat template of the test model.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import openai
import pytest

from interceptor.store.journal import recover_journal
from interceptor.store.lineage_audit import audit_lineage
from interceptor.store.records import ChainRecord, RolloutRecord, SampleRecord
from interceptor.viewer.detail import TokenText, rollout_detail
from interceptor.viewer.index import summarise_line
from tests.fakes import Fault, Slow
from tests.interceptor.test_options import rollout, server  # noqa: F401  (a server with a record file, a client)
from tests.interceptor.test_trajectories import TOOLS, call_text, echo
from tests.invariants import assert_token_exact, keep_record

TASK_TOOL = {"type": "function", "function": {
    "name": "Task", "description": "hand a task to a sub-agent",
    "parameters": {"type": "object", "properties": {"description": {"type": "string"}, "prompt": {"type": "string"}},
                   "required": ["prompt"]}}}  # fmt: skip
MAIN_TOOLS = [TASK_TOOL, *TOOLS]
BRIEF = "Count the lines of every file under src and report the total"


def task_call(prompt: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "Task", "arguments": {"description": "count", "prompt": prompt}}) + \
        "\n</tool_call>"


def tree(record: RolloutRecord) -> list[tuple]:
    return [(s.chain.kind, s.chain.parent, s.chain.parent_turn, s.chain.linked_by) for s in record.samples]


async def test_a_sub_agent_a_title_and_a_compaction_hang_from_the_turns_that_started_them(rollout, scripted, server):
    handle, client = rollout
    summary = "The sub-agent counted 42 lines under src."
    scripted.script("Counting lines", task_call(BRIEF), call_text("wc -l src/*"), "42 lines in all",
                    "The total is 42.", summary, "Resumed: 42 lines.")
    main = [{"role": "system", "content": "You are the main agent."}, {"role": "user", "content": "How big is src?"}]
    title = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "How big is src?"}]
    await client.chat.completions.create(model="p", messages=title)  # a side call before the main one
    reply = await client.chat.completions.create(model="p", messages=main, tools=MAIN_TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    # the sub-agent: its own system prompt and tools, opened by the Task call's prompt
    sub = [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": BRIEF}]
    sub_reply = await client.chat.completions.create(model="p", messages=sub, tools=TOOLS)
    sub += [echo(sub_reply.choices[0].message), {"role": "tool", "tool_call_id": sub_reply.choices[0].message
                                                 .tool_calls[0].id, "content": "42 total"}]  # fmt: skip
    sub_done = await client.chat.completions.create(model="p", messages=sub, tools=TOOLS)
    main += [echo(reply.choices[0].message),
             {"role": "tool", "tool_call_id": call.id, "content": sub_done.choices[0].message.content}]
    await client.chat.completions.create(model="p", messages=main, tools=MAIN_TOOLS)
    # compaction: a summary of the main chain, then the conversation resumed from it
    summarise = [{"role": "system", "content": "You are a context summarization assistant."},
                 {"role": "user", "content": "How big is src?"}, {"role": "user", "content": "Summarise."}]
    written = await client.chat.completions.create(model="p", messages=summarise)
    resumed = [main[0], {"role": "user", "content": "Summary so far:\n" + written.choices[0].message.content}]
    await client.chat.completions.create(model="p", messages=resumed, tools=MAIN_TOOLS)

    (recovered,) = recover_journal(server.config.record_path)  # what a crash now would leave
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "ok" and record.reward == 1.0
    assert recovered.samples == record.samples, "the journal keeps the tree"
    assert tree(record) == [
        ("auxiliary", 1, None, "timing"),  # made before the main chain: hangs from it, from no turn
        ("main", None, None, None),
        ("subagent", 1, 0, "tool_call"),  # the Task call of the main chain's first turn
        ("summary", 1, 1, "history"),
        ("compaction", 1, 1, "summary"),
    ]
    assert [s.auxiliary for s in record.samples] == [True, False, False, True, False]
    # the resumed chain rewrote the conversation; the sub-agent and the side calls did not (the viewer's row agrees)
    assert record.forks == 1 and summarise_line(0, 0, record.to_json()).forks == 1
    assert_token_exact(record, scripted.calls)


async def test_a_concurrent_turn_copies_the_history_and_its_sampled_tokens_are_trained_only_in_the_first(
        rollout, scripted, server):
    handle, client = rollout
    scripted.script(call_text("ls"), Slow("a", 0.5), Slow("b", 0.5))  # both turns are under way at once
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    reply = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    messages += [echo(reply.choices[0].message), {"role": "tool", "tool_call_id": call.id, "content": "out"}]
    await asyncio.gather(*(client.chat.completions.create(model="p", messages=messages, tools=TOOLS,
                                                          extra_body={"seed": s}) for s in (1, 2)))  # fmt: skip
    record = await server.finish_rollout(handle.id, reward=0.5)
    first, copy = record.samples
    assert tree(record) == [("main", None, None, None), ("fork", 0, 0, "history")]
    assert len(copy.turns) == 2 and copy.chain.shared >= copy.turns[0].completion_end
    span = slice(copy.turns[0].completion_start, copy.turns[0].completion_end)
    assert set(first.completion_mask[span]) == {1} and set(copy.completion_mask[span]) == {0}
    assert set(copy.old_logprobs[span]) == {0.0}
    sampled = sum(len(c.token_ids) for c in scripted.calls)
    assert sum(s.completion_tokens for s in record.samples) == sampled, "each sampled token trained once"
    assert_token_exact(record, scripted.calls)
    keep_record(record, "concurrent-turns")
    # the viewer marks the copied turn as trained in the first sample, and the tree counts it so
    detail = rollout_detail(record.to_json_dict(), TokenText())
    spans = [span for span in detail["samples"][1]["spans"] if span["kind"] == "sampled"]
    assert [span["trained_in"] for span in spans] == [0, None]
    node = detail["tree"][1]
    assert (node["kind"], node["parent"], node["depth"]) == ("fork", 0, 1)
    assert node["sampled"] - node["trained"] == span.stop - span.start


async def test_a_record_whose_samples_train_a_token_twice_fails_the_audit(rollout, scripted, server):
    handle, client = rollout
    scripted.script(call_text("ls"), "done")
    messages = [{"role": "user", "content": "task"}]
    reply = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    messages += [echo(reply.choices[0].message),
                 {"role": "tool", "tool_call_id": reply.choices[0].message.tool_calls[0].id, "content": "out"}]
    await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    record = await server.finish_rollout(handle.id, reward=1.0)
    (main,) = record.samples
    assert audit_lineage(record.samples) == []
    # A hand-made fork that re-renders the first turn and trains its sampled tokens again.
    end = main.turns[0].completion_end
    fork = SampleRecord(index=1, input_ids=main.input_ids[:end] + [7, 8], completion_mask=main.completion_mask[:end] + [1, 1],
                        old_logprobs=main.old_logprobs[:end] + [-0.1, -0.2], turns=[replace(main.turns[0]),
                        replace(main.turns[0], prompt_start=end, completion_start=end, completion_end=end + 2)],
                        auxiliary=False, fork_reason="edited", chain=ChainRecord(kind="fork", parent=0,
                        parent_turn=0, linked_by="history", shared=end))  # fmt: skip
    problems = audit_lineage([main, fork])
    start = main.turns[0].completion_start
    assert problems and problems[0] == f"token {start} (id {main.input_ids[start]}) is trained in samples 0 and 1"
    # and the tree itself is checked: a second root, a parent that is not there
    assert audit_lineage([main, replace(fork, completion_mask=[0] * end + [1, 1], old_logprobs=[0.0] * end +
                                        [-0.1, -0.2], chain=ChainRecord(kind="main"))])  # fmt: skip
    assert audit_lineage([main, replace(fork, chain=replace(fork.chain, parent=5))])


async def test_a_rollout_whose_samples_fail_the_audit_is_failed_with_cause_lineage_and_no_reward(
        rollout, scripted, server, monkeypatch):
    handle, client = rollout
    scripted.script("done")
    await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "task"}], tools=TOOLS)
    import interceptor.rollouts

    monkeypatch.setattr(interceptor.rollouts, "audit_lineage", lambda samples: ["token 3 is trained in samples 0 and 1"])
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "failed" and record.reward is None
    assert record.failure.cause == "lineage" and "token 3 is trained in samples 0 and 1" in record.failure.message
    written = RolloutRecord.from_json_dict(json.loads(server.config.record_path.read_text().splitlines()[-1]))
    assert written.status == "failed" and written.reward is None and written.samples == record.samples


async def test_a_sub_agent_lost_to_the_upstream_fails_the_rollout_even_when_the_main_chain_goes_on(
        rollout, scripted, server):
    handle, client = rollout
    failing = [Fault(status=503)] * server.config.upstream.attempts  # every try the server makes
    scripted.script(task_call(BRIEF), *failing, "The sub-agent failed; done anyway.")
    main = [{"role": "system", "content": "You are the main agent."}, {"role": "user", "content": "How big is src?"}]
    reply = await client.chat.completions.create(model="p", messages=main, tools=MAIN_TOOLS)
    sub = [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": BRIEF}]
    with pytest.raises(openai.APIStatusError):
        await client.chat.completions.create(model="p", messages=sub, tools=TOOLS)
    main += [echo(reply.choices[0].message), {"role": "tool", "tool_call_id": reply.choices[0].message.tool_calls[0].id,
                                              "content": "the sub-agent failed"}]  # fmt: skip
    await client.chat.completions.create(model="p", messages=main, tools=MAIN_TOOLS)  # the main chain succeeds
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "failed" and record.reward is None and record.failure.cause == "upstream"


async def test_a_sub_agents_first_turn_retried_after_a_failure_finds_its_tool_call_again(rollout, scripted, server):
    handle, client = rollout
    failing = [Fault(status=503)] * server.config.upstream.attempts  # every try the server makes
    scripted.script(task_call(BRIEF), *failing, "42 lines", "The total is 42.")
    main = [{"role": "system", "content": "You are the main agent."}, {"role": "user", "content": "How big is src?"}]
    reply = await client.chat.completions.create(model="p", messages=main, tools=MAIN_TOOLS)
    sub = [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": BRIEF}]
    with pytest.raises(openai.APIStatusError):
        await client.chat.completions.create(model="p", messages=sub, tools=TOOLS)
    # the agent tries again later (a request of its own, not an SDK retry, which would share the spent budget)
    done = await client.chat.completions.create(model="p", messages=sub, tools=TOOLS, extra_body={"seed": 1})
    main += [echo(reply.choices[0].message), {"role": "tool", "tool_call_id": reply.choices[0].message.tool_calls[0].id,
                                              "content": done.choices[0].message.content}]  # fmt: skip
    await client.chat.completions.create(model="p", messages=main, tools=MAIN_TOOLS)
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "ok" and record.reward == 1.0
    assert tree(record) == [("main", None, None, None), ("subagent", 0, 0, "tool_call")]
    assert_token_exact(record, scripted.calls)


async def test_a_turn_codex_marks_as_a_sub_agents_starts_a_sub_agent_even_from_its_parents_history(server, scripted):
    """`spawn_agent(fork_context=true)` starts the sub-agent from its parent's history: only Codex's word
    (`x-openai-subagent` in `client_metadata`) tells it from a rewritten history."""
    from openai import AsyncOpenAI

    handle = server.open_rollout()
    client = AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0)
    scripted.script("Looking.", "Counted 42.")
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}]
    history = [{"type": "message", "role": "user", "content": "How big is src?"}]
    turn = {"request_kind": "turn", "thread_id": "t1"}
    first = await client.responses.create(model="p", input=history, tools=tools, store=False,
                                          extra_body={"client_metadata": {"x-codex-turn-metadata": json.dumps(turn)}})
    forked = [*history, *[item.model_dump(exclude_none=True) for item in first.output],
              {"type": "message", "role": "user", "content": "Count the lines under src."}]
    metadata = {"x-codex-turn-metadata": json.dumps({**turn, "thread_id": "t2"}), "x-openai-subagent": "collab_spawn"}
    await client.responses.create(model="p", input=forked, tools=tools, store=False,
                                  extra_body={"client_metadata": metadata})
    record = await server.finish_rollout(handle.id, reward=1.0)
    # without the mark this would extend the main chain; with it, a sub-agent from the main chain's turn 0
    assert tree(record) == [("main", None, None, None), ("subagent", 0, 0, "history")]
    assert not [e for e in record.events if e["kind"] == "side_request"]  # a sub-agent's turn is a turn
