"""`BodyCache` reads a body exactly as `orjson.loads` does, whatever recent bodies it matched against, while
parsing only the bytes after the history it shares with them."""

from __future__ import annotations

import gc
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interceptor.wire.body_cache import BodyCache

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
TRICKY = ['plain', 'a ] b', 'brace } and [', 'quote " inside', 'back\\slash', 'end\\', 'ü中文🙂', '{"messages": []}',
          '"messages":[', '\n\t', '']


def body(messages: list, *, first: str = "model", tools=TOOLS, indent=None) -> bytes:
    fields = {"model": "m", "messages": messages, "tools": tools, "stream": False}
    order = [first] + [k for k in fields if k != first]
    return json.dumps({k: fields[k] for k in order}, indent=indent, ensure_ascii=False).encode()


def conversation(n: int, text: str = "x") -> list[dict]:
    out = [{"role": "system", "content": "sys"}]
    for i in range(n):
        out.append({"role": "user", "content": f"{text} {i}"})
        out.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "function": {"name": "bash"}}]})
    return out


@pytest.mark.parametrize("first", ["model", "messages", "tools", "stream"])
@pytest.mark.parametrize("indent", [None, 2])
def test_an_appended_history_reuses_the_parsed_prefix_and_reads_like_orjson(first, indent):
    cache = BodyCache()
    previous = None
    for turns in range(1, 6):
        raw = body(conversation(turns), first=first, indent=indent)
        parsed = cache.read(raw)
        assert parsed.body == orjson.loads(raw)
        if previous is not None:
            assert parsed.reused == len(previous.body["messages"])
            assert parsed.same_rest
            assert all(a is b for a, b in zip(parsed.body["messages"], previous.body["messages"]))
            assert parsed.body["tools"] is previous.body["tools"]  # the tool list is the same object
            assert parsed.previous == f"derived {turns - 1}"
        cache.keep(parsed, f"derived {turns}")
        previous = parsed


def test_a_rewritten_message_reuses_only_the_messages_before_it():
    cache = BodyCache()
    history = conversation(4)
    cache.keep(cache.read(body(history)), "first")
    edited = [*history[:3], {"role": "assistant", "content": "rewritten"}, *history[4:]]
    parsed = cache.read(body(edited))
    assert parsed.reused == 3
    assert parsed.body == orjson.loads(body(edited))


def test_a_message_rewritten_before_the_last_boundaries_kept_is_read_whole():
    cache = BodyCache()
    history = conversation(10)
    cache.keep(cache.read(body(history)), "first")
    edited = [*history[:3], {"role": "assistant", "content": "compacted"}, *history[4:]]
    parsed = cache.read(body(edited))
    assert parsed.reused == 0 and parsed.previous is None
    assert parsed.body == orjson.loads(body(edited))


def test_the_cache_holds_no_bytes_of_the_history_only_the_parsed_messages():
    """The message text is held once: a kept body leaves its digests and the bytes after its array behind."""
    cache = BodyCache()
    history = conversation(50, text="a long tool result " * 40)
    raw = body(history)
    cache.keep(cache.read(raw), "first")
    raw = body(history + [{"role": "user", "content": "next"}])
    cache.keep(cache.read(raw), "second")
    held, seen, stack = 0, set(), [cache]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, int, float, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray, memoryview)):
            held += len(obj)
            continue
        stack.extend(gc.get_referents(obj))
    tail = len(raw) - raw.rindex(b"]", 0, raw.index(b'"tools"'))
    assert held < 2 * (tail + 16 * 8 + 64), held  # two bodies kept: each its tail and its digests
    assert len(raw) > 40_000


def test_changed_fields_after_the_history_are_read_anew():
    cache = BodyCache()
    history = conversation(2)
    cache.keep(cache.read(body(history)), "first")
    tools = [*TOOLS, {"type": "function", "function": {"name": "read"}}]
    raw = body(history + [{"role": "user", "content": "more"}], tools=tools)
    parsed = cache.read(raw)
    assert parsed.reused == len(history) and not parsed.same_rest
    assert parsed.body == orjson.loads(raw)


def test_a_second_history_key_after_the_array_is_read_as_orjson_reads_it():
    cache = BodyCache()
    history = conversation(2)
    cache.keep(cache.read(body(history)), "first")
    raw = body(history)[:-1] + b', "messages": [{"role": "user", "content": "the last key wins"}]}'
    parsed = cache.read(raw)
    assert parsed.body == orjson.loads(raw)
    assert parsed.body["messages"] == [{"role": "user", "content": "the last key wins"}]


def test_invalid_bytes_after_a_shared_history_raise_orjsons_error():
    cache = BodyCache()
    history = conversation(2)
    cache.keep(cache.read(body(history)), "first")
    broken = body(history + [{"role": "user", "content": "x"}])[:-3]
    with pytest.raises(orjson.JSONDecodeError):
        cache.read(broken)


def test_a_main_and_a_side_conversation_each_extend_their_own_history():
    cache = BodyCache()
    main, side = conversation(3), [{"role": "system", "content": "Write a title"}, {"role": "user", "content": "t"}]
    cache.keep(cache.read(body(main)), "main")
    cache.keep(cache.read(body(side)), "side")
    parsed = cache.read(body(main + [{"role": "user", "content": "next"}]))
    assert parsed.reused == len(main) and parsed.previous == "main"


message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.sampled_from(TRICKY) | st.text(max_size=8)}
)


@settings(max_examples=150, deadline=None)
@given(
    start=st.lists(message, min_size=1, max_size=6),
    steps=st.lists(
        st.tuples(st.sampled_from(["append", "edit", "tools", "same", "drop"]), st.integers(0, 10), message),
        max_size=8,
    ),
    first=st.sampled_from(["model", "messages", "tools"]),
    indent=st.sampled_from([None, 1]),
)
def test_any_sequence_of_bodies_reads_like_orjson_with_a_fingerprint_of_the_bytes(start, steps, first, indent):
    cache = BodyCache()
    messages, tools = list(start), TOOLS
    bodies = [body(messages, first=first, indent=indent)]
    for action, index, new in steps:
        if action == "append":
            messages = [*messages, new]
        elif action == "edit":
            messages = [*messages[: index % len(messages)], new, *messages[index % len(messages) + 1:]]
        elif action == "tools":
            tools = [*tools, {"type": "function", "function": {"name": f"t{index}"}}]
        elif action == "drop" and len(messages) > 1:
            messages = messages[:-1]
        bodies.append(body(messages, first=first, tools=tools, indent=indent))
    for i, raw in enumerate(bodies):
        parsed = cache.read(raw)
        assert parsed.body == orjson.loads(raw)
        assert parsed.fingerprint == BodyCache().read(raw).fingerprint
        assert 0 <= parsed.reused <= len(parsed.body["messages"])
        cache.keep(parsed, i)


@pytest.mark.parametrize("before, after, same", [
    ({"meta": {"a": 1, "b": 2}}, {"meta": {"b": 2, "a": 1}}, True),  # another key order: the same values
    ({"meta": {"a": 1}}, {"meta": {"a": True}}, False),  # Python holds 1 == True; JSON does not
    ({"meta": {"a": 1}}, {"meta": {"a": 1.0}}, False),
    ({"meta": {"a": 1}}, {"meta": {"a": 1, "b": None}}, False),
])
def test_fields_after_the_history_are_the_same_rest_only_when_their_values_are(before, after, same):
    cache = BodyCache()
    history = conversation(2)
    first = cache.read(orjson.dumps({"messages": history, "tools": TOOLS, **before}))
    cache.keep(first, "first")
    raw = orjson.dumps({"messages": history + [{"role": "user", "content": "next"}], "tools": TOOLS, **after})
    parsed = cache.read(raw)
    assert parsed.reused == len(history) and parsed.same_rest is same
    expected = orjson.loads(raw)
    sorted_keys = orjson.OPT_SORT_KEYS
    assert orjson.dumps(parsed.body, option=sorted_keys) == orjson.dumps(expected, option=sorted_keys)  # types too
    if same:
        assert parsed.body["tools"] is first.body["tools"]  # what the dialect derived from them still holds
