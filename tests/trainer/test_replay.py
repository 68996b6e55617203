"""Replay: a real agent run again against a recorded rollout (a cassette in tests/data/cassettes/, recorded from the
embedded default), with no model. Each agent must make the same chat calls turn for turn and earn the same reward;
an edited cassette is reported as a divergence at the right request and in the right part of the prompt. The
matching itself is tested without an agent first."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agents.specs.claude import ClaudeAgent
from agents.specs.codex import CodexAgent
from agents.specs.opencode import OpenCodeAgent
from agents.specs.packages import PACKAGES
from agents.specs.pi import PiAgent
from agents.tasks import load_tasks
from interceptor.store.recorder import read_records
from interceptor.store.records import RolloutRecord
from interceptor.tools.replay_upstream import ReplayUpstream, recorded_turns
from tests.agents.agent_runs import require_agent
from trainer.replay import replay_rollout

ROOT = Path(__file__).resolve().parents[2]
CASSETTES = ROOT / "tests" / "data" / "cassettes"
TASKS = {task.id: task for task in load_tasks(ROOT / "examples" / "tasks" / "arithmetic.jsonl")}
AGENTS = {  # as `interceptor run --agent NAME` builds them (trainer/run_main.py), which recorded the cassettes
    "pi": lambda context: PiAgent(context_window=context, max_tokens=512),
    "opencode": lambda context: OpenCodeAgent(context_window=context, max_tokens=512),
    "claude": lambda context: ClaudeAgent(max_output_tokens=None),
    "codex": lambda context: CodexAgent(context_window=context),
}


def cassette(agent: str) -> RolloutRecord:
    (record,) = read_records(CASSETTES / f"{agent}.jsonl")
    return record


@pytest.fixture(scope="module")
def tokenizer(tool_model_dir):
    return AutoTokenizer.from_pretrained(str(tool_model_dir))


def _with_prompt_token(record: RolloutRecord, position: int, token: int) -> RolloutRecord:
    """The record with one token of its first sample replaced (every turn whose prompt covers it changes)."""
    sample = record.samples[0]
    ids = list(sample.input_ids)
    ids[position] = token
    return dataclasses.replace(record, samples=[dataclasses.replace(sample, input_ids=ids), *record.samples[1:]])


# ---- matching, without an agent -------------------------------------------------------------------------------


async def test_each_recorded_prompt_matches_exactly_and_is_answered_with_its_own_tokens(tokenizer):
    record = cassette("pi")
    async with ReplayUpstream(record, tokenizer) as upstream:
        for turn in recorded_turns(record):
            outcome = upstream.match(turn.prompt_ids)
            assert outcome.matched == (turn.sample, turn.turn) and not outcome.normalised
        extra = upstream.match(recorded_turns(record)[0].prompt_ids)
    assert extra.divergence is not None and "an extra request" in extra.divergence.where


async def _match_after(tokenizer, agent: str, pattern: str, replacement: str):
    """The first recorded turn of `agent`'s cassette, and how its prompt with `pattern` replaced is matched."""
    record = cassette(agent)
    first = recorded_turns(record)[0]
    text = tokenizer.decode(first.prompt_ids, skip_special_tokens=False)
    changed = re.sub(pattern, replacement, text)
    assert changed != text
    async with ReplayUpstream(record, tokenizer) as upstream:
        outcome = upstream.match(tokenizer.encode(changed, add_special_tokens=False))
    return first, outcome


async def test_a_new_date_and_sandbox_path_match_after_normalising_and_say_so(tokenizer):
    first, outcome = await _match_after(tokenizer, "pi", r"Current date: \d{4}-\d{2}-\d{2}", "Current date: 2031-01-02")
    assert outcome.matched == (first.sample, first.turn) and outcome.normalised and "<date>" in outcome.volatile


async def test_another_sandbox_backends_directory_matches_after_normalising(tokenizer):
    # the cassette was recorded in the namespace sandbox: /tmp/interceptor-sandboxes/interceptor-rollout-...
    first, outcome = await _match_after(tokenizer, "pi", r"/interceptor-sandboxes/interceptor-rollout-[\w-]{8}",
                                        "/interceptor-rollout-ab_cd-12")
    assert outcome.matched == (first.sample, first.turn) and outcome.normalised, outcome


async def test_another_hosts_kernel_in_claude_codes_environment_block_matches_after_normalising(tokenizer):
    first, outcome = await _match_after(tokenizer, "claude", r"OS Version: Linux [^\n]+",
                                        "OS Version: Linux 5.15.0-1-generic")
    assert (outcome.matched == (first.sample, first.turn) and outcome.normalised
            and "OS Version: <os>" in outcome.volatile)


async def test_a_changed_system_prompt_tool_schema_or_message_is_named(tokenizer):
    record = cassette("pi")
    first = recorded_turns(record)[0]
    text = tokenizer.decode(first.prompt_ids, skip_special_tokens=False)
    cases = {
        "the system prompt": text.replace("coding assistant", "coding helper", 1),
        "the tools": text.replace('"description"', '"summary"', 1),
        "message 2 (user)": text.replace("What is 2 + 3?", "What is 2 + 4?", 1),
    }
    assert all(changed != text for changed in cases.values())
    for where, changed in cases.items():
        async with ReplayUpstream(record, tokenizer) as upstream:
            outcome = upstream.match(tokenizer.encode(changed, add_special_tokens=False))
        assert outcome.matched is None and outcome.divergence.where.startswith(where), (where, outcome)


# ---- real agents, replayed --------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("agent", ["pi", "opencode", "codex", "claude"])
async def test_a_recorded_rollout_replays_turn_for_turn_with_the_same_reward(agent, tool_model_dir):
    require_agent(PACKAGES[agent])
    record = cassette(agent)
    report = await replay_rollout(record, TASKS[record.metadata["task_id"]], agent=AGENTS[agent],
                                  model_dir=tool_model_dir)
    assert report.turn_for_turn, report.summary()
    assert report.reward_agrees and report.replay.reward == record.reward, report.summary()
    assert report.recorded_calls >= 2  # a tool call, its result, then more: not a one-shot answer


@pytest.mark.e2e
async def test_an_edited_tool_result_is_reported_at_the_request_that_carries_it(tool_model_dir, tokenizer):
    require_agent(PACKAGES["pi"])
    record = cassette("pi")
    turns = record.samples[0].turns
    assert len(turns) >= 2
    # a token between the first sampled turn and the second turn's sampled tokens: the tool result the agent sent
    position = turns[0].completion_end + (turns[1].completion_start - turns[0].completion_end) // 2
    edited = _with_prompt_token(record, position, tokenizer.encode("X", add_special_tokens=False)[0])
    report = await replay_rollout(edited, TASKS[record.metadata["task_id"]], agent=AGENTS["pi"],
                                  model_dir=tool_model_dir)
    request, divergence = report.first_divergence
    assert request == 2 and report.outcomes[0].matched == (0, 0), report.summary()
    assert divergence.where.startswith("message") and "tool result" in divergence.where, report.summary()
    assert not report.matched and "diverged at request 2" in report.summary()


@pytest.mark.e2e
def test_the_command_replays_a_record_file_and_exits_0_when_it_matches(tmp_path, tool_model_dir):
    require_agent(PACKAGES["pi"])
    record = cassette("pi")
    done = subprocess.run(
        [sys.executable, "-m", "interceptor.cli", "replay", str(CASSETTES / "pi.jsonl"), "--rollout",
         record.rollout_id, "--tasks", str(ROOT / "examples/tasks/arithmetic.jsonl"), "--model", str(tool_model_dir)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matched turn for turn, and the reward agreed" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "interceptor.cli", "replay", str(CASSETTES / "pi.jsonl"), "--rollout", "nope",
         "--tasks", str(ROOT / "examples/tasks/arithmetic.jsonl"), "--model", str(tool_model_dir)],
        capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode == 2 and "no rollout 'nope'" in missing.stderr
