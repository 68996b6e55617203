"""The real mini-swe-agent (PyPI, pinned in agents.specs.packages) against the interception server in front of a
scripted policy.

mini calls the model through litellm with one `bash` tool and ends when a command prints
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. A reply without a tool call is a format error: mini drops that reply from
its history and sends an error message in its place, so the server sees a rewritten history, which must fork a new
sample (never a splice). The tool's environment holds no credential: the secret is in mini's 0600 config, passed to
litellm as an argument. Skipped when mini-swe-agent is not installed (scripts/setup-agents.sh); failed under CI=true.
"""

from __future__ import annotations

import pytest

from agents.specs.mini_swe import MiniSweAgent
from agents.specs.packages import MINI_SWE
from tests.agents.agent_runs import bash_call, check_first_request, interception_server, require_agent, run_agent
from tests.e2e.test_agents_pi import assert_no_credentials_in
from tests.invariants import assert_token_exact

pytestmark = pytest.mark.e2e

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture
def mini() -> MiniSweAgent:
    return MiniSweAgent(binary=require_agent(MINI_SWE), max_tokens=256)


async def test_mini_runs_its_bash_tool_submits_and_the_loop_is_one_token_exact_sample(mini, scripted, tiny_model_dir):
    scripted.script(bash_call("env > env.txt; echo hi"), bash_call(SUBMIT))
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(mini, server, instruction="Write the environment to env.txt, then submit.")
    print(f"\nmini-swe-agent: first request {run.first_request_s:.2f} s after launch, run {run.result.seconds:.2f} s")

    assert run.result.ok, run.result
    assert "env.txt" in run.files, "the tool call was executed in the workspace"
    first, second = run.chat_requests
    assert [t["function"]["name"] for t in first.body["tools"]] == ["bash"]
    assert first.body["max_tokens"] == 256 and "Write the environment to env.txt" in first.body["messages"][1]["content"]
    tool_results = [m for m in second.body["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 1 and '"output": "hi\\n"' in tool_results[0]["content"]

    main = [s for s in run.record.samples if not s.auxiliary]
    assert len(run.record.samples) == len(main) == 1 and len(main[0].turns) == 2
    assert_token_exact(run.record, scripted.calls)
    assert_no_credentials_in(run.files["env.txt"], run.secret)
    assert run.files_with_secret == {"home/.config/mini-swe-agent/interceptor.yaml"}
    check_first_request("mini-swe-agent", MINI_SWE, run, first)


async def test_a_reply_mini_drops_from_its_history_forks_a_new_sample(mini, scripted, tiny_model_dir):
    """Each text reply (no tool call) is a format error: mini sends its history without that reply plus an error
    message, so each request after one forks. The third in a row ends the run (exit 0)."""
    scripted.script("I am done.", "Still done.", "Done again.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(mini, server, instruction="Say that you are done.")

    assert run.result.ok, run.result
    assert len(run.chat_requests) == 3
    assert not any(m["role"] == "assistant" for m in run.chat_requests[2].body["messages"]), "mini dropped them"
    samples = run.record.samples
    assert [len(s.turns) for s in samples] == [1, 1, 1]
    assert samples[0].fork_reason is None
    assert all("is not the assistant turn this server returned" in s.fork_reason for s in samples[1:])
    assert_token_exact(run.record, scripted.calls)
