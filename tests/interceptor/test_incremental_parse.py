"""A request read incrementally (only the history elements after those it shares with a recent body) is the very
request a whole parse gives, for every dialect, along conversations the way agents grow them: chat tool loops,
Claude Code's Messages turns with a moving `cache_control` marker and mid-list system notes, Codex's Responses
items, compaction requests and rewritten histories."""

from __future__ import annotations

import copy

import orjson
import pytest

from interceptor.errors import BadRequest
from interceptor.wire.body_cache import BodyCache
from interceptor.wire.dialects.chat import CHAT
from interceptor.wire.dialects.messages import MESSAGES
from interceptor.wire.dialects.registry import DIALECTS
from interceptor.wire.dialects.responses import RESPONSES
from interceptor.wire.incoming import read_request as _parse

CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
ANTHROPIC_TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]


def chat_bodies() -> list[dict]:
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    bodies = []
    for turn in range(5):
        bodies.append({"model": "m", "messages": copy.deepcopy(messages), "tools": CHAT_TOOLS, "stream": True})
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{turn}", "content": [{"type": "text", "text": f"out {turn}"}]}]
    summary = [{"role": "system", "content": "You are a context summarization assistant."},
               {"role": "user", "content": "Summarise."}]
    bodies.append({"model": "m", "messages": summary})  # a compaction request, then the resumed history
    bodies.append({"model": "m", "messages": messages[:2] + [{"role": "user", "content": "summary"}], "tools": CHAT_TOOLS})
    return bodies


def messages_bodies() -> list[dict]:
    history: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]}]
    bodies = []
    for turn in range(5):
        marked = copy.deepcopy(history)
        last = next(m for m in reversed(marked) if isinstance(m["content"], list))
        last["content"][-1]["cache_control"] = {"type": "ephemeral"}  # Claude Code marks the last block
        bodies.append({"model": "claude", "max_tokens": 512, "stream": True, "tools": ANTHROPIC_TOOLS,
                       "system": [{"type": "text", "text": "You are Claude Code."}], "messages": marked})
        history += [{"role": "assistant", "content": [{"type": "text", "text": "Running."},
                                                      {"type": "tool_use", "id": f"t{turn}", "name": "Bash",
                                                       "input": {"command": "ls"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{turn}",
                                                  "content": f"out {turn}"}, {"type": "text", "text": "go on"}]}]
        if turn == 2:
            history.append({"role": "system", "content": "Environment: the date changed."})
    return bodies


def responses_bodies() -> list[dict]:
    items: list[dict] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it."}]}]
    bodies = []
    ids = [("thread_id", "t1"), ("turn_id", "u1"), ("session_id", "t1")]
    for turn in range(5):
        metadata = dict(ids[turn % 3:] + ids[:turn % 3])  # Codex writes this map in a new key order every request
        bodies.append({"model": "gpt", "instructions": "You are Codex.", "input": copy.deepcopy(items),
                       "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
                       "stream": True, "store": False, "client_metadata": metadata})
        call = {"type": "function_call", "call_id": f"k{turn}", "name": "exec_command", "arguments": '{"cmd": "ls"}'}
        output = {"type": "function_call_output", "call_id": f"k{turn}", "output": f"out {turn}"}
        if turn % 2:  # Codex's turns: reasoning, a message, its calls (which join that message), their outputs
            items += [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
                      call, {**call, "call_id": f"k{turn}b"}, output, {**output, "call_id": f"k{turn}b"}]
        else:
            items += [call, output]
    return bodies



# A conversation grown the way agents grow it, per registered dialect (a dialect added to the registry fails here).
CONVERSATIONS = {"chat": chat_bodies, "messages": messages_bodies, "responses": responses_bodies}

@pytest.mark.parametrize("dialect, bodies", [(d, CONVERSATIONS[d.name]()) for d in DIALECTS],
                         ids=[d.name for d in DIALECTS])
@pytest.mark.parametrize("relayed", [False, True], ids=["gate", "black_box"])
def test_an_incremental_read_is_the_request_a_whole_parse_gives(dialect, bodies, relayed):
    cache = BodyCache(dialect.history_key)
    reused_some = False
    for body in bodies:
        raw = orjson.dumps(body)
        parsed, chat = _parse(dialect, cache, raw, relayed)
        cache.keep(parsed, chat)
        assert chat == dialect.parse(orjson.loads(raw), relayed=relayed)
        reused_some |= parsed.reused > 0
    assert reused_some


@pytest.mark.parametrize("dialect, bodies", [(d, CONVERSATIONS[d.name]()) for d in DIALECTS],
                         ids=[d.name for d in DIALECTS])
def test_an_incremental_read_says_which_earlier_messages_it_carries_and_they_are_those_very_objects(dialect, bodies):
    """The trajectory trusts `carried` instead of comparing the history: it must name the earlier request's list,
    and that many of this request's messages must be its objects."""
    cache = BodyCache(dialect.history_key)
    previous = None
    carried_some = False
    for body in bodies:
        parsed, chat = _parse(dialect, cache, orjson.dumps(body), False)
        cache.keep(parsed, chat)
        carried, count = chat.carried
        if count:
            assert previous is not None and carried is previous.messages
            assert count <= len(previous.messages) and count <= len(chat.messages)
            assert all(a is b for a, b in zip(chat.messages[:count], previous.messages[:count]))
            carried_some = True
        else:
            assert chat.carried == (None, 0)
        previous = chat
    assert carried_some


def test_codex_fields_written_in_a_new_key_order_each_turn_still_carry_the_history():
    """Codex's `client_metadata` comes in a new key order every request: the same values, so the conversion resumes
    where the last request's ended (it used to start over, a cost that grew with the session)."""
    cache = BodyCache("input")
    bodies = responses_bodies()
    for number, body in enumerate(bodies):
        raw = orjson.dumps(body)
        parsed, chat = _parse(RESPONSES, cache, raw, False)
        cache.keep(parsed, chat)
        if number:
            assert parsed.same_rest and chat.carried[1] > 0
        assert chat == RESPONSES.parse(orjson.loads(raw))


def test_messages_elements_are_reused_up_to_the_block_whose_cache_control_moved():
    cache = BodyCache("messages")
    first, second = messages_bodies()[1:3]
    cache.keep(*_parse(MESSAGES, cache, orjson.dumps(first), False))
    parsed, _ = _parse(MESSAGES, cache, orjson.dumps(second), False)
    assert parsed.reused == len(first["messages"]) - 1  # the last element lost its marker: read again


def test_a_bad_new_message_is_a_400_naming_its_index_and_the_cache_keeps_the_last_good_body():
    cache = BodyCache("messages")
    body = chat_bodies()[2]
    cache.keep(*_parse(CHAT, cache, orjson.dumps(body), False))
    bad = {**body, "messages": body["messages"] + [{"role": "wizard", "content": "x"}]}
    with pytest.raises(BadRequest) as error:
        _parse(CHAT, cache, orjson.dumps(bad), False)
    assert f"messages[{len(body['messages'])}]" in error.value.message
    good = {**body, "messages": body["messages"] + [{"role": "user", "content": "fine"}]}
    parsed, chat = _parse(CHAT, cache, orjson.dumps(good), False)
    assert parsed.reused == len(body["messages"]) and chat == CHAT.parse(good)
