"""Stop-hooks: a tool call the policy samples that a rollout's stop rule matches is recorded as sampled, token-exact,
and never reaches the agent: the agent (the real `openai` SDK here) gets a 403 in the OpenAI error shape for it and
for every later call, and the rollout carries a `policy_stop` event naming the rule."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.errors import BadRequest
from interceptor.gate.stop_rules import first_hit, parse_stop_rules
from tests.agents.agent_runs import bash_call
from tests.invariants import assert_token_exact

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]  # fmt: skip
ADMIN = "operator-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
RULES = [{"name": "no-network", "pattern": r"\bcurl\b", "tools": ["bash"]}]


def call(name: str, arguments: str) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                  "function": {"name": name, "arguments": arguments}}]}  # fmt: skip


def test_a_rule_matches_the_decoded_strings_of_the_listed_tools_only():
    (rule,) = parse_stop_rules(RULES)
    assert first_hit([rule], call("bash", '{"command": "curl http://10.0.0.1/x"}')).rule == "no-network"
    assert first_hit([rule], call("bash", '{"command": "echo \\"curl\\" | sh", "cwd": "/"}')) is not None  # decoded
    assert first_hit([rule], call("bash", '{"command": "ls"}')) is None
    assert first_hit([rule], call("fetch", '{"url": "curl"}')) is None  # not a listed tool
    assert first_hit([rule], call("bash", '{"command": "curl')) is not None  # malformed arguments: the raw text
    (everywhere,) = parse_stop_rules([{"name": "paths", "pattern": "^/etc/"}])
    assert first_hit([everywhere], call("read", '{"path": "/etc/shadow"}')).tool == "read"
    assert first_hit([everywhere], {"role": "assistant", "content": "/etc/passwd"}) is None  # text is not a call


@pytest.mark.parametrize("rules", [
    "curl", [{"name": "x"}], [{"name": "", "pattern": "a"}], [{"name": "x", "pattern": "("}],
    [{"name": "x", "pattern": "a", "tools": "bash"}], [{"name": "x", "pattern": "a", "extra": 1}],
    [{"name": "x", "pattern": "a" * 2000}], [{"name": f"r{i}", "pattern": "a"} for i in range(65)],
])  # fmt: skip
def test_a_bad_rule_is_refused_with_a_clear_error(rules):
    with pytest.raises(BadRequest) as raised:
        parse_stop_rules(rules)
    assert raised.value.param == "stop_rules"


async def test_a_matching_call_is_recorded_as_sampled_and_the_agent_never_gets_it(scripted, tiny_model_dir):
    scripted.script("I will look around.", bash_call("curl http://10.0.0.1/answers.json"), "never sampled")
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, admin_token=ADMIN)
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        async with http.post(server.url + "/rollouts", json={"stop_rules": RULES}, headers=AUTH) as response:
            assert response.status == 201
            opened = await response.json()
        client = openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["secret"], max_retries=0)
        messages = [{"role": "user", "content": "Find the answers."}]
        first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "Go on."})
        for _ in range(2):  # the matching call, then any later one
            with pytest.raises(openai.PermissionDeniedError) as denied:
                await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            assert denied.value.code == "policy_stop" and "no-network" in denied.value.message
        record = await server.finish_rollout(opened["id"], reward=0.0)
    assert len(scripted.calls) == 2  # the call after the stop never reached the policy
    assert_token_exact(record, scripted.calls)
    (stop,) = [event for event in record.events if event["kind"] == "policy_stop"]
    assert (stop["rule"], stop["tool"]) == ("no-network", "bash") and "curl http://10.0.0.1" in stop["arguments"]


async def test_bad_stop_rules_on_the_admin_api_are_a_400(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, admin_token=ADMIN)
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        async with http.post(server.url + "/rollouts", json={"stop_rules": [{"name": "x", "pattern": "("}]},
                             headers=AUTH) as reply:
            body = await reply.json()
    assert reply.status == 400 and body["error"]["param"] == "stop_rules", body
