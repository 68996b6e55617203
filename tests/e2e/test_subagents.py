"""Real agents handing work to sub-agents through the gate, in front of a scripted policy: Claude Code's `Agent`
tool, OpenCode's `task` tool and Codex's `spawn_agent` (its `multi_agent_v1` namespace tool). Each rollout's record must hold the tree as it happened (the sub-agent's chain
under the turn whose tool call opened it, side calls as leaves), every chain token-exact, every sampled token trained
once (the lineage audit), and one reward reaching every chain.

The sub-agent's turns interleave with its parent's (Claude Code runs it in the background and goes on), so the
scripted policy routes replies by what the prompt holds: the sub-agent's tool list lacks its parent's
sub-agent tools. Skipped when the agents are not installed (scripts/setup-agents.sh); failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from agents import OpenCodeAgent
from agents.specs.claude import ClaudeAgent
from agents.specs.codex import CodexAgent
from agents.specs.packages import CLAUDE, CODEX, OPENCODE
from interceptor.store.records import RolloutRecord
from tests.agents.agent_runs import bash_call, interception_server, require_agent, run_agent
from tests.invariants import assert_token_exact, keep_record
from tests.viewer.test_viewer_browser import _artifacts, _require_browser, _start_viewer, browser_page
from trainer.rl.advantages import GroupFilter, build_group

pytestmark = pytest.mark.e2e

BRIEF = "Count the files in the workspace and report the number."
INSTRUCTION = "How many files are here? Use a sub-agent."


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def tree(record: RolloutRecord) -> list[tuple]:
    return [(s.chain.kind, s.chain.parent, s.chain.parent_turn, s.chain.linked_by) for s in record.samples]


def assert_one_reward_reaches_every_chain(record: RolloutRecord) -> None:
    """Graded 1 beside a rollout graded 0: every trained chain of it carries the same positive advantage."""
    group = [replace(record, reward=1.0), replace(record, rollout_id="other", reward=0.0)]
    outcome = build_group(group, group_id=0, model_version=0, rules=GroupFilter())
    trained = [s for s in record.samples if s.kind not in ("auxiliary", "summary") and any(s.completion_mask)]
    advantages = [s.advantage for s in outcome.samples[: len(trained)]]
    assert len(outcome.samples) == 2 * len(trained) and len(set(advantages)) == 1 and advantages[0] > 0


def draw_tree(record: RolloutRecord, out: Path, name: str, model: Path) -> None:
    """The viewer's page of the rollout, in Chromium: the sub-agent's chain drawn under the main one, the tokens
    of each sample marked; a screenshot to test-artifacts/viewer/NAME.png."""
    sync_playwright = _require_browser()
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollouts.jsonl").write_bytes(record.to_json() + b"\n")
    viewer, url = _start_viewer(out, model)
    try:
        with browser_page(sync_playwright, url) as (page, errors):
            page.wait_for_function("document.querySelectorAll('#rollouts tbody tr').length === 1")
            page.click("#rollouts tbody tr")
            page.wait_for_selector("#fork-tree li")
            nested = page.locator("#fork-tree li[data-kind=main] > ul > li[data-kind=subagent]")
            assert nested.count() == 1, page.inner_text("#fork-tree")
            assert "by its tool call" in nested.inner_text()
            assert page.locator("#sample-list .sample").count() == len(record.samples)
            page.locator("#fork-tree").scroll_into_view_if_needed()
            page.screenshot(path=str(_artifacts() / f"{name}.png"), full_page=True)
            assert errors == []
    finally:
        viewer.kill()
        viewer.wait()


async def test_claude_codes_agent_tool_records_the_sub_agent_under_the_turn_that_called_it(scripted, tiny_model_dir,
                                                                                         tmp_path):
    claude = ClaudeAgent(binary=require_agent(CLAUDE))
    sub_agent = lambda prompt: "ReportFindings" not in prompt  # noqa: E731  (the main agent's tools have it)
    scripted.route(sub_agent, call("Bash", command="ls | wc -l > count.txt; cat count.txt"), "There are 2 files.")
    scripted.script(call("Agent", description="count files", prompt=BRIEF, subagent_type="general-purpose"),
                    "Waiting for the sub-agent.", "All done: 2 files.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(claude, server, instruction=INSTRUCTION)

    assert run.result.ok and "All done: 2 files." in run.result.stdout, run.result
    assert "count.txt" in run.files, "the sub-agent's Bash call ran in the workspace"
    assert tree(run.record) == [("main", None, None, None), ("subagent", 0, 0, "tool_call")]
    main, sub = run.record.samples
    assert len(main.turns) == 3 and len(sub.turns) == 2  # the call, the wait, the answer; the sub-agent's two
    assert_token_exact(run.record, scripted.calls)
    assert sum(s.completion_tokens for s in run.record.samples) == sum(len(c.token_ids) for c in scripted.calls)
    assert_one_reward_reaches_every_chain(run.record)
    keep_record(run.record, "subagents-claude")
    await asyncio.to_thread(draw_tree, run.record, tmp_path / "run", "subagents-claude", tiny_model_dir)  # sync Playwright


async def test_opencodes_task_tool_records_the_sub_agent_under_the_turn_that_called_it(scripted, tiny_model_dir,
                                                                                       tmp_path):
    opencode = OpenCodeAgent(binary=require_agent(OPENCODE), context_window=65536, max_tokens=512)
    scripted.route(lambda prompt: "title generator" in prompt, "Counting files")
    scripted.route(lambda prompt: "todowrite" not in prompt,  # the sub-agent has neither task nor todowrite
                   bash_call("ls | wc -l > count.txt; cat count.txt"), "There are 2 files.")
    scripted.script(call("task", description="count files", prompt=BRIEF, subagent_type="general"),
                    "All done: 2 files.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(opencode, server, instruction=INSTRUCTION)

    assert run.result.ok and "All done: 2 files." in run.result.stdout, run.result
    assert "count.txt" in run.files, "the sub-agent's bash call ran in the workspace"
    kinds = tree(run.record)
    main = next(i for i, node in enumerate(kinds) if node[0] == "main")
    # the title request races the first turn: it hangs from the main chain, from whichever turn was last answered
    assert sorted((kind, parent, link) for kind, parent, _, link in kinds) == [
        ("auxiliary", main, "timing"), ("main", None, None), ("subagent", main, "tool_call")]
    assert next(node for node in kinds if node[0] == "subagent")[2] == 0, "opened by the main chain's first turn"
    assert [len(s.turns) for s in run.record.samples if s.kind != "auxiliary"] == [2, 2]
    assert_token_exact(run.record, scripted.calls)
    assert_one_reward_reaches_every_chain(run.record)
    keep_record(run.record, "subagents-opencode")
    await asyncio.to_thread(draw_tree, run.record, tmp_path / "run", "subagents-opencode", tiny_model_dir)  # sync Playwright


async def test_codexs_spawn_agent_records_the_sub_agent_under_the_turn_that_called_it(scripted, tiny_model_dir,
                                                                                    tmp_path):
    codex = CodexAgent(binary=require_agent(CODEX))

    def wait_for_it(prompt: str) -> str:  # the id Codex gave the sub-agent, from spawn_agent's output
        agent_id = re.findall(r'"agent_id":"([^"]+)"', prompt)[-1]
        return call("multi_agent_v1.wait_agent", targets=[agent_id], timeout_ms=60000)

    scripted.route(lambda prompt: "spawn_agent" not in prompt,  # a sub-agent spawns no further agents
                   call("exec_command", cmd="ls | wc -l > count.txt; cat count.txt"), "There are 2 files.")
    # the answer twice: Codex prints its last message, the answer or, if the sub-agent's notification comes before
    # it exits, the turn after that
    scripted.script(call("multi_agent_v1.spawn_agent", message=BRIEF), wait_for_it, *["All done: 2 files."] * 2)
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(codex, server, instruction=INSTRUCTION)

    assert run.result.ok and "All done: 2 files." in run.result.stdout, run.result
    assert "count.txt" in run.files, "the sub-agent's exec_command ran in the workspace"
    calls = [item for r in run.requests if r.path.endswith("/responses") for item in r.body["input"]
             if item.get("type") == "function_call" and item.get("namespace")]  # fmt: skip
    assert {(item["namespace"], item["name"]) for item in calls} == {("multi_agent_v1", "spawn_agent"),
                                                                     ("multi_agent_v1", "wait_agent")}
    assert tree(run.record) == [("main", None, None, None), ("subagent", 0, 0, "tool_call")]
    main, sub = run.record.samples
    # spawn, wait, answer; then a turn for the sub-agent's notification when it comes before Codex exits
    assert len(main.turns) in (3, 4) and len(sub.turns) == 2
    assert_token_exact(run.record, scripted.calls)
    assert_one_reward_reaches_every_chain(run.record)
    keep_record(run.record, "subagents-codex")
    await asyncio.to_thread(draw_tree, run.record, tmp_path / "run", "subagents-codex", tiny_model_dir)  # sync Playwright
