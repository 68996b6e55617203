"""Auth, bad input and upstream faults: every case is a 4xx/5xx OpenAI error with a clear message, the server
keeps serving, and nothing a failure touched turns into a recorded turn."""

from __future__ import annotations

import aiohttp
import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.fakes import Fault, Slow

CHAT = "/chat/completions"
GOOD = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def server(scripted, tiny_model_dir, tmp_path):
    config = ServerConfig(
        upstream=UpstreamConfig(base_url=scripted.url, attempts=2, backoff_initial_s=0.01, request_timeout_s=2.0),
        model_dir=tiny_model_dir,
        admin_token="admin-token-for-tests",
        record_path=tmp_path / "rollouts.jsonl",
        max_body_bytes=1024 * 1024,
        keepalive_s=0.2,
        stream_hold_s=0.2,
    )
    async with InterceptionServer(config) as server:
        yield server


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http, url, body, secret=None, raw: bytes | None = None):
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    async with http.post(url, json=None if raw is not None else body, data=raw, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def assert_openai_error(body, *, fragment: str = "") -> None:
    assert set(body["error"]) >= {"message", "type", "code"}
    assert fragment.lower() in body["error"]["message"].lower()


async def test_auth_matrix(server, http, scripted):
    mine, other = server.open_rollout(), server.open_rollout()
    finished = server.open_rollout()
    await server.finish_rollout(finished.id)
    cases = [
        (mine.base_url, mine.secret, 200),
        (mine.base_url, other.secret, 401),
        (mine.base_url, None, 401),
        (mine.base_url, "Bearer-less-garbage", 401),
        (finished.base_url, finished.secret, 409),
        (finished.base_url, mine.secret, 401),
        (mine.base_url.replace(mine.id, "0123456789abcdef"), mine.secret, 404),
    ]
    for base_url, secret, expected in cases:
        status, body = await post(http, base_url + CHAT, GOOD, secret)
        assert status == expected, (base_url, expected, body)
        if expected != 200:
            assert_openai_error(body)


@pytest.mark.parametrize(
    ("raw", "body", "fragment"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (None, {"model": "policy"}, "messages"),
        (None, {"messages": "hi"}, "messages"),
        (None, {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        (None, {"messages": [{"role": "user", "content": 7}]}, "content"),
        (None, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "image_url"),
        (None, {**GOOD, "n": 2}, "n=1"),
        (None, {**GOOD, "temperature": "hot"}, "temperature"),
        (None, {**GOOD, "max_tokens": -1}, "max_tokens"),
        (None, {**GOOD, "stream": "yes"}, "stream"),
        (None, {**GOOD, "tools": [{"type": "function"}]}, "tools"),
        (None, {"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        (None, {**GOOD, "max_tokens": 100_000}, "maximum context length"),
    ],
)
async def test_bad_input_gets_a_4xx_openai_error_and_the_server_keeps_serving(server, http, scripted, raw, body, fragment):
    handle = server.open_rollout()
    status, answer = await post(http, handle.base_url + CHAT, body, handle.secret, raw=raw)
    assert 400 <= status < 500, answer
    assert_openai_error(answer, fragment=fragment)
    status, _ = await post(http, handle.base_url + CHAT, GOOD, handle.secret)
    assert status == 200


async def test_tools_secret_opens_the_tools_endpoint_and_nothing_else(server, http):
    mine, other = server.open_rollout(), server.open_rollout()
    status, _ = await post(http, mine.base_url + "/tools/answer", {"answer": 1}, mine.tools_secret)
    assert status == 200
    status, body = await post(http, mine.base_url + CHAT, GOOD, mine.tools_secret)
    assert status == 401
    status, _ = await post(http, other.base_url + "/tools/answer", {"answer": 1}, mine.tools_secret)
    assert status == 401


async def test_context_overflow_is_openai_shaped_and_recorded(server, http, scripted):
    handle = server.open_rollout()
    status, body = await post(http, handle.base_url + CHAT, {**GOOD, "max_tokens": 100_000}, handle.secret)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    record = await server.finish_rollout(handle.id)
    assert [e["kind"] for e in record.events] == ["context_length_exceeded"]
    assert record.samples == [] and scripted.calls == []


async def test_huge_body_is_413(server, http):
    handle = server.open_rollout()
    huge = {"messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    status, body = await post(http, handle.base_url + CHAT, huge, handle.secret)
    assert status == 413
    assert_openai_error(body)


async def test_unknown_paths_under_a_rollout_are_openai_404s(server, http):
    handle = server.open_rollout()
    status, body = await post(http, handle.base_url + "/embeddings", GOOD, handle.secret)
    assert status == 404
    assert_openai_error(body, fragment="not an endpoint")
    status, body = await post(http, handle.base_url + "/tools/teleport", {}, handle.secret)
    assert status == 404
    assert_openai_error(body, fragment="teleport")


async def test_unknown_fields_are_accepted(server, http, scripted):
    handle = server.open_rollout()
    body = {**GOOD, "store": False, "metadata": {"a": 1}, "parallel_tool_calls": True, "some_future_field": [1]}
    status, answer = await post(http, handle.base_url + CHAT, body, handle.secret)
    assert status == 200, answer


async def test_answer_tool_records_the_submission_and_reveals_no_reward(server, http):
    handle = server.open_rollout()
    status, body = await post(http, handle.base_url + "/tools/answer", {"answer": "42"}, handle.secret)
    assert status == 200
    assert "reward" not in str(body).lower()
    record = await server.finish_rollout(handle.id)
    assert record.answer == "42"


async def test_upstream_down_is_503_with_retry_after_and_records_nothing(server, http, scripted):
    scripted.script(Fault(500), Fault(502))  # both attempts fail
    handle = server.open_rollout()
    async with http.post(
        handle.base_url + CHAT, json=GOOD, headers={"Authorization": f"Bearer {handle.secret}"}
    ) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"]
    record = await server.finish_rollout(handle.id)
    assert record.status == "failed" and record.failure.cause == "upstream"
    assert record.samples == []


async def test_upstream_fault_then_success_is_retried_transparently(server, http, scripted):
    scripted.script(Fault(503), "fine")
    handle = server.open_rollout()
    status, body = await post(http, handle.base_url + CHAT, GOOD, handle.secret)
    assert status == 200 and body["choices"][0]["message"]["content"] == "fine"


async def test_upstream_timeout_is_504(server, http, scripted):
    scripted.script(Slow("late", delay_s=5.0), Slow("late", delay_s=5.0))
    handle = server.open_rollout()
    status, body = await post(http, handle.base_url + CHAT, GOOD, handle.secret)
    assert status == 504
    assert_openai_error(body, fragment="did not answer")


async def test_slow_stream_sends_keepalives_then_the_answer(server, http, scripted):
    scripted.script(Slow("worth the wait", delay_s=0.7))
    handle = server.open_rollout()
    async with http.post(
        handle.base_url + CHAT, json={**GOOD, "stream": True}, headers={"Authorization": f"Bearer {handle.secret}"}
    ) as resp:
        assert resp.status == 200
        text = (await resp.read()).decode()
    assert ": keepalive" in text
    assert "worth the wait" in text and text.rstrip().endswith("data: [DONE]")


async def test_admin_api_opens_and_finishes_rollouts_and_records_are_durable(server, http, scripted, tmp_path):
    admin = "admin-token-for-tests"
    status, _ = await post(http, server.url + "/rollouts", {}, "wrong")
    assert status == 401
    status, opened = await post(http, server.url + "/rollouts", {"sampling": {"temperature": 0.5}}, admin)
    assert status == 201 and set(opened) == {"id", "base_url", "secret", "tools_secret"}
    status, _ = await post(http, opened["base_url"] + CHAT, GOOD, opened["secret"])
    assert status == 200
    assert scripted.calls[-1].body["temperature"] == 0.5  # the rollout's pinned sampling wins
    status, record = await post(http, f"{server.url}/rollouts/{opened['id']}/finish", {"status": "ok"}, admin)
    assert status == 200 and record["status"] == "ok"
    lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 1 and opened["id"] in lines[0]
    assert opened["secret"] not in lines[0]
    status, body = await post(http, f"{server.url}/rollouts/{opened['id']}/finish", {}, admin)
    assert status == 404
