"""Stop-hooks end to end: Pi in its sandbox, a scripted policy that first runs a harmless command and then samples a
forbidden one. The forbidden call never runs (it would have submitted an answer through the box's `answer` command,
and no answer reached the server), the sample holds it token-exact, and the task's policy decides the outcome."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agents import PiAgent
from agents.runner import Runner, RunnerConfig
from agents.specs.packages import PI
from agents.tasks import Grader, Grading, Task
from tests.agents.agent_runs import MAX_MODEL_LEN, bash_call, require_agent
from tests.invariants import assert_token_exact

from .test_swe import server  # noqa: F401  (fixture: a server on port 0 in front of the scripted upstream)

TASK = Task(id="submit-7", instruction="Submit 7 with: answer 7", grader=Grader(kind="answer", expected="7"),
            stop_rules=({"name": "no-answer-pwned", "pattern": r"answer\s+pwned", "tools": ["bash"]},))


@pytest.mark.e2e
@pytest.mark.parametrize(("stopped", "status", "reward"), [("zero", "ok", 0.0), ("drop", "failed", None)])
async def test_a_forbidden_call_is_recorded_and_never_run(server, scripted, stopped, status, reward):
    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    scripted.script(bash_call("echo warm-up"), bash_call("answer pwned"), "Done.")
    task = dataclasses.replace(TASK, grading=Grading(stopped=stopped))
    async with asyncio.timeout(180):
        (record,) = await Runner(server, RunnerConfig(agent=pi)).run_tasks([task], n=1)
    assert (record.status, record.reward) == (status, reward), (record.failure, record.events)
    if status == "failed":
        assert record.failure.cause == "policy_stop" and "no-answer-pwned" in record.failure.message
    assert record.answer is None  # the box's `answer pwned` never ran
    assert len(scripted.calls) == 2  # nothing was sampled after the stop
    assert_token_exact(record, scripted.calls)
    (stop,) = [event for event in record.events if event["kind"] == "policy_stop"]
    assert stop["rule"] == "no-answer-pwned" and "answer pwned" in stop["arguments"]
    tool_output = next(m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool")
    assert "warm-up" in tool_output  # the allowed call before it did run
