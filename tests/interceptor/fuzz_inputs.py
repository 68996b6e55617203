"""Generated requests for fuzzing the interception server, shared by `tests/interceptor/test_fuzz.py`
(Hypothesis draws) and `bench/fuzz.py` (a seeded `random.Random`).

A `Case` is a short scenario of HTTP `Step`s with one `label` naming its input class (`message.assistant.
tool_calls=int`: the part before "=" says where, the part after what), so a failure found by the benchmark can be
regrouped and replayed. Each case gets one thing wrong. Steps use the scenario's rollout: the one the caller hands
in, or the one an `admin_open` step just opened (when that open is refused, the rest of the scenario is skipped).
Bodies are bytes: they may be invalid JSON or UTF-8, or nested deeper than any encoder allows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tests.interceptor.fuzz_values import (
    AUTH_VARIANTS,
    DEPTHS,
    HEADERS,
    HTTP_LAYER_AUTH,
    PART_TYPE_LABELS,
    PART_TYPES,
    RAW_BODIES,
    RAW_LABELS,
    Source,
    deep_list,
    deep_object,
    deep_schema,
    encode,
    junk,
)

__all__ = [
    "Case",
    "FAMILIES",
    "NESTING_DEPTHS",
    "Step",
    "admin_case",
    "any_case",
    "chat_case",
    "dialect_case",
    "junk_case",
    "models_case",
    "nesting_case",
    "nesting_cases",
    "tools_case",
]


@dataclass(frozen=True, slots=True)
class Step:
    route: str  # chat | models | tools | admin_open | admin_show | admin_finish | health
    method: str
    path: str  # "{rid}" stands for the scenario's rollout id
    auth: str  # a key of AUTHORIZATIONS: how the Authorization header is made
    body: bytes | None = None
    stream: bool = False  # a 200 answer is an SSE stream
    http_layer: bool = False  # aiohttp's HTTP parser answers before the app (plain-text 400): no shape check
    headers: tuple[tuple[str, bytes], ...] = ()  # more headers, sent as given (Content-Type defaults to JSON)
    shape: str = "openai"  # the error shape of the route's dialect: "openai", or "anthropic" (Messages)


@dataclass(frozen=True, slots=True)
class Case:
    label: str
    steps: tuple[Step, ...]


_CHAT = "/rollout/{rid}/v1/chat/completions"
_TOOL = {"type": "function", "function": {"name": "bash", "description": "run a command",
                                          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                         "required": ["cmd"]}}}
_CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}


def _history(src: Source) -> list[dict]:
    """A valid conversation: one user turn, or a tool loop the server did not generate (a fork)."""
    shape = src.choice(("user", "system_user", "tool_loop", "parts"))
    if shape == "user":
        return [{"role": "user", "content": src.choice(("hi", "what is 2+2?", "Ünïcödé ✓"))}]
    if shape == "system_user":
        return [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "task"}]
    if shape == "parts":
        return [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": None, "tool_calls": [dict(_CALL)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        {"role": "user", "content": "and now?"},
    ]


def valid_chat(src: Source) -> dict:
    body: dict = {"model": "policy", "messages": _history(src), "max_tokens": 16}
    if src.choice((False, True)):
        body["tools"] = [_TOOL]
    if src.choice((False, True)):
        body["stream"] = True
        body["stream_options"] = {"include_usage": src.choice((False, True))}
    return body


def _chat_step(body: dict | bytes, auth: str = "secret", path: str = _CHAT, method: str = "POST",
               headers: tuple[tuple[str, bytes], ...] = ()) -> Step:
    stream = isinstance(body, dict) and body.get("stream") is True
    raw = body if isinstance(body, bytes) else encode(body)
    return Step("chat", method, path, auth, raw, stream=stream, headers=headers)


_CHAT_FIELDS = (
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "seed", "n", "stop", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "response_format", "user", "metadata", "frequency_penalty", "logit_bias", "reasoning_effort",
)
_MESSAGE_KEYS = ("<message>", "role", "content", "tool_calls", "tool_call_id", "reasoning_content", "name")
_CALL_KEYS = ("<call>", "id", "type", "function", "function.name", "function.arguments")
_PART_KEYS = ("<part>", "type", "text", "image_url")
_TOOL_KEYS = ("<tools>", "<tool>", "type", "function", "function.name", "function.description",
              "function.parameters", "function.parameters.deep", "function.parameters.properties")


def chat_case(src: Source) -> Case:
    """The chat route: a valid request, or one with a field of the wrong type or size."""
    kind = src.choice(("valid", "field", "field", "message", "message", "tool_call", "content_part", "tools",
                       "many_messages"))
    body = valid_chat(src)
    messages = body["messages"]
    if kind == "valid":
        return Case("valid", (_chat_step(body),))
    if kind == "many_messages":
        count = src.choice((300, 3000))
        roles = ("user", "assistant")
        messages[:] = [{"role": roles[i % 2], "content": f"m{i}"} for i in range(count - 1)]
        return Case(f"many_messages={count}", (_chat_step(body),))
    if kind == "field":
        field = src.choice(_CHAT_FIELDS)
        label, body[field] = junk(src)
        return Case(f"field.{field}={label}", (_chat_step(body),))
    if kind == "message":
        index = src.integer(0, len(messages) - 1)
        role = messages[index]["role"]
        key = src.choice(_MESSAGE_KEYS)
        label, value = junk(src)
        if key == "<message>":
            messages[index] = value
        else:
            messages[index][key] = value
        return Case(f"message.{role}.{key}={label}", (_chat_step(body),))
    if kind == "tool_call":
        call = {**_CALL, "function": dict(_CALL["function"])}
        key = src.choice(_CALL_KEYS)
        label, value = junk(src)
        calls: list = [call]
        if key == "<call>":
            calls = [value]
        elif key.startswith("function."):
            call["function"][key.removeprefix("function.")] = value
        else:
            call[key] = value
        messages[:] = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": calls},
                       {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
        return Case(f"tool_call.{key}={label}", (_chat_step(body),))
    if kind == "content_part":
        key = src.choice(_PART_KEYS)
        label, value = junk(src)
        part: object = {"type": "text", "text": "hi"}
        if key == "<part>":
            part = value
        elif key == "image_url":
            part = {"type": "image_url", "image_url": {"url": value}}
        else:
            part[key] = value  # type: ignore[index]
        role = src.choice(("user", "system", "assistant", "tool"))
        messages[:] = [{"role": role, "content": [part], "tool_call_id": "call_1"}]
        return Case(f"content_part.{role}.{key}={label}", (_chat_step(body),))
    return _tools_field_case(src, body)


def _tools_field_case(src: Source, body: dict) -> Case:
    key = src.choice(_TOOL_KEYS)
    tool = {"type": "function", "function": dict(_TOOL["function"])}
    if key == "function.parameters.deep":
        depth = src.choice(DEPTHS)
        tool["function"]["parameters"] = deep_schema(depth)
        label = f"deep_schema{depth}"
    else:
        label, value = junk(src)
        if key == "<tools>":
            body["tools"] = value
        elif key == "<tool>":
            tool = value  # type: ignore[assignment]
        elif key == "function.parameters.properties":
            tool["function"]["parameters"] = {"type": "object", "properties": {"x": value}}
        elif key.startswith("function."):
            tool["function"][key.removeprefix("function.")] = value
        else:
            tool[key] = value
    if key != "<tools>":
        body["tools"] = [tool]
    return Case(f"tools.{key}={label}", (_chat_step(body),))


def _open(body: bytes = b"{}", auth: str = "admin") -> Step:
    return Step("admin_open", "POST", "/rollouts", auth, body)


def _finish(body: bytes = b'{"status": "ok"}', auth: str = "admin") -> Step:
    return Step("admin_finish", "POST", "/rollouts/{rid}/finish", auth, body)


def _show(path: str = "/rollouts/{rid}", auth: str = "admin") -> Step:
    return Step("admin_show", "GET", path, auth)


# Rollout ids a client might put in a path (percent-encoded where needed).
_PATH_IDS = ("{rid}", "0123456789abcdef", "%C3%A9t%C3%A9", "%FF%FE", "%00", "a%2Fb", "..", "x" * 3000,
             "{rid}%20", "%7Brid%7D")


def tools_case(src: Source) -> Case:
    """The tools route on a fresh rollout; the rollout is then finished, so the answer goes into a record."""
    kind = src.choice(("answer", "answer", "body", "raw", "auth", "name"))
    name, auth, body = "answer", "tools_secret", b'{"answer": "42"}'
    if kind == "answer":
        label, value = junk(src)
        body, label = encode({"answer": value}), f"answer={label}"
    elif kind == "body":
        label, value = junk(src)
        body, label = encode(value), f"body={label}"
    elif kind == "raw":
        raw = src.choice(RAW_LABELS)
        body, label = RAW_BODIES[raw], f"raw.{raw}"
    elif kind == "auth":
        auth = src.choice(AUTH_VARIANTS)
        label = f"auth.{auth}"
    else:
        name = src.choice(("teleport", "%C3%A9", "%FF", "answer%00", "answer%2F..", "ANSWER", "x" * 2000))
        label = f"name.{name[:20]}"
    step = Step("tools", "POST", f"/rollout/{{rid}}/v1/tools/{name}", auth, body)
    return Case(label, (_open(), step, _show(), _finish()))


def models_case(src: Source) -> Case:
    """The models route with one thing wrong: the Authorization header, the rollout id, or the method."""
    kind = src.choice(("auth", "rid", "method"))
    auth, rid, method, body = "secret", "{rid}", "GET", None
    if kind == "auth":
        auth = src.choice(AUTH_VARIANTS)
        label = f"auth.{auth}"
    elif kind == "rid":
        rid = src.choice(_PATH_IDS[1:])
        label = f"rid.{rid[:12]}"
    else:
        method = src.choice(("POST", "PUT", "DELETE"))
        body = RAW_BODIES[src.choice(RAW_LABELS)]
        label = f"method.{method}"
    return Case(label, (Step("models", method, f"/rollout/{rid}/v1/models", auth, body),))


_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "unknown_key")
_FINISH_KEYS = ("status", "failure", "failure.cause", "failure.message", "reward")


def nesting_cases(depth: int) -> dict[str, Case]:
    """A value nested `depth` deep in every place the server keeps what a client sent (its record, the journal,
    the admin answers, the upstream request), each wrapped in a few more levels there: a server that checks the
    value alone, not what it is written inside, fails near orjson's limit of 255."""
    chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    arguments = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": deep_object(depth)}}]}
    tool = {"type": "function", "function": {"name": "bash", "parameters": deep_schema(depth)}}
    described = {"type": "function", "function": {"name": "bash", "description": deep_list(depth)}}
    places = {
        "tools.function.parameters": (_chat_step({**chat, "tools": [tool]}),),
        "tools.function.description": (_chat_step({**chat, "tools": [described]}),),
        "tool_call.function.arguments": (_chat_step({**chat, "messages": [chat["messages"][0], arguments,
                                                     {"role": "tool", "tool_call_id": "call_1", "content": "x"}]}),),
        "open.metadata": (_open(encode({"metadata": deep_object(depth)})), _chat_step(chat), _show(), _finish()),
        "open.metadata.key": (_open(encode({"metadata": {"key": deep_list(depth)}})), _show(), _finish()),
        "open.sampling.seed": (_open(encode({"sampling": {"seed": deep_list(depth)}})), _chat_step(chat), _finish()),
        "tools.answer": (_open(), Step("tools", "POST", "/rollout/{rid}/v1/tools/answer", "tools_secret",
                                       encode({"answer": deep_list(depth)})), _show(), _finish()),
        "finish.failure.message": (_open(), _finish(encode({"status": "failed", "failure": {
            "cause": "c", "message": deep_list(depth)}})), _finish()),
    }
    return {place: Case(f"{place}=deep{depth}", steps) for place, steps in places.items()}


NESTING_DEPTHS = range(250, 258)


def nesting_case(src: Source) -> Case:
    cases = nesting_cases(src.choice(NESTING_DEPTHS))
    return cases[src.choice(sorted(cases))]


def admin_case(src: Source) -> Case:
    """The admin routes: open with bad settings (then use, show and finish what opened), show, finish."""
    kind = src.choice(("sampling", "sampling", "sampling_whole", "metadata", "open_raw", "open_auth",
                       "show", "finish", "finish", "finish_raw", "finish_auth"))
    label, value = junk(src)
    if kind == "sampling":
        key = src.choice(_SAMPLING_KEYS)
        body, label = encode({"sampling": {key: value}}), f"open.sampling.{key}={label}"
    elif kind == "sampling_whole":
        body, label = encode({"sampling": value}), f"open.sampling={label}"
    elif kind == "metadata":
        key = src.choice(("<metadata>", "key"))
        metadata = value if key == "<metadata>" else {"key": value}
        body, label = encode({"metadata": metadata}), f"open.metadata.{key}={label}"
    elif kind == "open_raw":
        raw = src.choice(RAW_LABELS)
        body, label = RAW_BODIES[raw], f"open.raw.{raw}"
    elif kind == "open_auth":
        auth = src.choice(AUTH_VARIANTS)
        return Case(f"open.auth.{auth}", (_open(auth=auth), _finish()))
    elif kind == "show":
        if src.choice(("auth", "rid")) == "auth":
            auth = src.choice(AUTH_VARIANTS)
            return Case(f"show.auth.{auth}", (_open(), _show(auth=auth), _finish()))
        rid = src.choice(_PATH_IDS[1:])
        return Case(f"show.rid.{rid[:12]}", (_open(), _show(f"/rollouts/{rid}"), _finish()))
    elif kind == "finish_auth":
        auth = src.choice(AUTH_VARIANTS)
        return Case(f"finish.auth.{auth}", (_open(), _finish(auth=auth), _finish()))
    else:
        if kind == "finish_raw":
            raw = src.choice(RAW_LABELS)
            finish, label = RAW_BODIES[raw], f"finish.raw.{raw}"
        else:
            key = src.choice(_FINISH_KEYS)
            fields: dict = {"status": "failed", "failure": {"cause": "test", "message": "m"}, "reward": 1.0}
            if key.startswith("failure."):
                fields["failure"][key.removeprefix("failure.")] = value
            else:
                fields[key] = value
            finish, label = encode(fields), f"finish.{key}={label}"
        return Case(label, (_open(), _finish(finish), _finish()))
    # what opened is used: a chat turn (its sampling settings reach the upstream), shown, and finished
    good = encode({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    return Case(label, (_open(body), _chat_step(good), _show(), _finish()))


def junk_case(src: Source) -> Case:
    """Bodies that are not a chat request at all, and Authorization headers and paths of every kind."""
    kind = src.choice(("raw", "raw", "auth", "path", "method", "headers"))
    if kind == "raw":
        raw = src.choice(RAW_LABELS)
        return Case(f"raw.{raw}", (_chat_step(RAW_BODIES[raw]),))
    body = valid_chat(src)
    if kind == "auth":
        auth = src.choice(AUTH_VARIANTS)
        return Case(f"auth.{auth}", (_chat_step(body, auth=auth),))
    if kind == "method":
        method = src.choice(("GET", "PUT", "PATCH", "DELETE", "OPTIONS"))  # HEAD answers carry no body to check
        return Case(f"method.{method}", (_chat_step(body, method=method),))
    if kind == "headers":
        name = src.choice(tuple(HEADERS))
        raw, headers = HEADERS[name](encode(body))
        step = Step("chat", "POST", _CHAT, "secret", raw, headers=headers, stream=body.get("stream") is True)
        return Case(f"headers.{name}", (step,))
    rid = src.choice(_PATH_IDS[1:])
    return Case(f"path.rid.{rid[:12]}", (_chat_step(body, path=f"/rollout/{rid}/v1/chat/completions"),))


# Each dialect's turn route, its error shape, and a valid body with every kind of content part or block it takes,
# each one's type given by `t` (text parts, tool results, a system block, an assistant turn with a tool call).
_DIALECTS: dict[str, tuple[str, str, dict[str, Callable[[object], dict]]]] = {
    "chat": ("/rollout/{rid}/v1/chat/completions", "openai", {
        "user_part": lambda t: {"messages": [{"role": "user", "content": [{"type": t, "text": "hi"}]}]},
        "system_part": lambda t: {"messages": [{"role": "system", "content": [{"type": t, "text": "be brief"}]},
                                               {"role": "user", "content": "hi"}]},
        "tool_part": lambda t: {"messages": [
            {"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [dict(_CALL)]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": t, "text": "done"}]}]},
        "tool_call_type": lambda t: {"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{**_CALL, "type": t}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"}]},
        "tool_type": lambda t: {"messages": [{"role": "user", "content": "hi"}],
                                "tools": [{**_TOOL, "type": t}]},
    }),
    "messages": ("/rollout/{rid}/v1/messages", "anthropic", {
        "user_block": lambda t: {"messages": [{"role": "user", "content": [{"type": t, "text": "hi"}]}]},
        "system_block": lambda t: {"system": [{"type": t, "text": "be brief"}],
                                   "messages": [{"role": "user", "content": "hi"}]},
        "assistant_block": lambda t: {"messages": [
            {"role": "user", "content": "go"}, {"role": "assistant", "content": [{"type": t, "text": "ok"}]},
            {"role": "user", "content": "and?"}]},
        "tool_result_block": lambda t: {"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": t, "text": "done"}]}]}]},
        "tool_type": lambda t: {"messages": [{"role": "user", "content": "hi"}],
                                "tools": [{"type": t, "name": "bash", "input_schema": {"type": "object"}}]},
        "tool_choice_type": lambda t: {"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": t}},
    }),
    "responses": ("/rollout/{rid}/v1/responses", "openai", {
        "input_part": lambda t: {"input": [{"role": "user", "content": [{"type": t, "text": "hi"}]}]},
        "assistant_part": lambda t: {"input": [
            {"role": "user", "content": "go"},
            {"type": "message", "role": "assistant", "content": [{"type": t, "text": "ok"}]},
            {"role": "user", "content": "and?"}]},
        "function_call_output_part": lambda t: {"input": [
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": t, "text": "done"}]}]},
        "item_type": lambda t: {"input": [{"type": t, "role": "user", "content": "hi"}]},
        "reasoning_part": lambda t: {"input": [
            {"role": "user", "content": "go"}, {"type": "reasoning", "summary": [{"type": t, "text": "think"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"role": "user", "content": "and?"}]},
        "tool_type": lambda t: {"input": "hi", "tools": [{"type": t, "name": "bash", "parameters": {}}]},
    }),
}


# the place and type of a valid body in each dialect, sent with every Content-Encoding header
_VALID_PART = {"chat": ("user_part", "text"), "messages": ("user_block", "text"),
               "responses": ("input_part", "input_text")}


def dialect_case(src: Source) -> Case:
    """Each dialect's turn: a content part's or block's `type` that is not a string the dialect knows, or a valid
    body with a Content-Encoding header of every kind. A 4xx must be in the dialect's own error shape."""
    dialect = src.choice(tuple(_DIALECTS))
    path, shape, places = _DIALECTS[dialect]
    base = {"model": "policy", "max_output_tokens" if dialect == "responses" else "max_tokens": 16}
    if src.choice(("part_type", "part_type", "encoding")) == "encoding":
        name = src.choice(tuple(HEADERS))
        valid = places[_VALID_PART[dialect][0]](_VALID_PART[dialect][1])
        raw, headers = HEADERS[name](encode({**base, **valid}))
        return Case(f"{dialect}.headers.{name}", (Step(dialect, "POST", path, "secret", raw, headers=headers,
                                                       shape=shape),))
    place = src.choice(tuple(places))
    label = src.choice(PART_TYPE_LABELS)
    body = {**base, **places[place](PART_TYPES[label])}
    return Case(f"{dialect}.{place}.type={label}", (Step(dialect, "POST", path, "secret", encode(body), shape=shape),))


def http_layer_case(src: Source) -> Case:
    """Headers aiohttp's parser refuses with its own plain-text 400 before the app sees the request."""
    auth = src.choice(HTTP_LAYER_AUTH)
    step = Step("chat", "POST", _CHAT, auth, encode({"messages": [{"role": "user", "content": "hi"}]}),
                http_layer=True)
    return Case(f"http_layer.{auth}", (step,))


# family -> (generator, weight) for a mixed load
FAMILIES: dict[str, tuple[Callable[[Source], Case], int]] = {
    "chat": (chat_case, 50),
    "dialects": (dialect_case, 10),
    "junk": (junk_case, 12),
    "tools": (tools_case, 10),
    "models": (models_case, 5),
    "admin": (admin_case, 14),
    "nesting": (nesting_case, 2),
    "http_layer": (http_layer_case, 2),
}
_WEIGHTED = tuple(name for name, (_, weight) in FAMILIES.items() for _ in range(weight))


def any_case(src: Source) -> Case:
    return FAMILIES[src.choice(_WEIGHTED)][0](src)
