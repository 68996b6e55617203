"""`share`: the tool lists and system prompts that every rollout of an agent sends are held once in the process,
and only a value equal byte for byte to a kept one is replaced by it."""

from __future__ import annotations

import orjson
import pytest

from interceptor.wire.body_cache import BodyCache
from interceptor.wire.dialects.chat import CHAT
from interceptor.wire.dialects.messages import MESSAGES
from interceptor.wire.dialects.registry import DIALECTS
from interceptor.wire.dialects.responses import RESPONSES
from interceptor.wire.incoming import read_request
from interceptor.wire.shared_values import share

TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Does what its name says. " * 8,
                                           "parameters": {"type": "object", "properties": {}}}} for i in range(6)]


def test_an_equal_value_is_replaced_by_the_kept_one_and_a_different_one_is_not():
    first = orjson.loads(orjson.dumps(TOOLS))
    assert share(first) is first
    again = orjson.loads(orjson.dumps(TOOLS))
    assert share(again) is first
    reordered = [dict(reversed(list(t.items()))) for t in orjson.loads(orjson.dumps(TOOLS))]
    assert share(reordered) is reordered  # same content, another key order: rendered differently, so not shared
    edited = orjson.loads(orjson.dumps(TOOLS))
    edited[3]["function"]["description"] += "!"
    assert share(edited) is edited
    number = orjson.loads(orjson.dumps([*TOOLS, {"n": 1}]))
    assert share(orjson.loads(orjson.dumps([*TOOLS, {"n": 1.0}]))) is not number  # 1 and 1.0 are told apart


def test_small_values_and_scalars_are_returned_as_they_are():
    small = [{"type": "function", "function": {"name": "bash"}}]
    assert share(small) is small and share(orjson.loads(orjson.dumps(small))) is not small
    assert share(None) is None and share(3) == 3


LONG = "You are a coding agent. Follow the instructions. " * 20
BODIES = {
    CHAT: {"model": "m", "tools": TOOLS,
           "messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}]},
    MESSAGES: {"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": LONG}],
               "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                          "input_schema": t["function"]["parameters"]} for t in TOOLS],
               "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "m", "instructions": LONG, "input": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", **t["function"]} for t in TOOLS]},
}


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)  # BODIES needs one per registered dialect
def test_two_rollouts_sending_the_same_tools_and_system_prompt_hold_one_copy_of_them(dialect):
    raw = orjson.dumps(BODIES[dialect])
    (first, one), (second, two) = (read_request(dialect, BodyCache(dialect.history_key), raw, False)
                                   for _ in range(2))  # two rollouts: a body cache each
    assert one.tools is two.tools and len(one.tools) == len(TOOLS)
    assert one == two
    if dialect is not CHAT:  # the system prompt is converted from a field; chat's is a message of the history
        assert one.messages[0] is two.messages[0] and one.messages[0]["content"] == LONG
    large = [k for k in first.body if k != dialect.history_key and len(orjson.dumps(first.body[k])) > 512]
    assert "tools" in large and all(first.body[k] is second.body[k] for k in large)  # the parsed fields too
