"""Property: whatever a client sends, the server answers with an OpenAI-shaped 4xx or a success, never a 5xx.

Hypothesis draws requests from `fuzz_inputs` (wrong types in every field, deep nesting, huge and negative numbers,
invalid JSON and UTF-8, odd Authorization and Content-Encoding headers and paths, content part types of every JSON
kind in the three dialects) and sends them byte for byte to one real
`InterceptionServer` (interception_gate, over the scripted upstream, which never fails unless told: so a 5xx is
the input's fault). Every answer is checked: status < 500, a 4xx in its dialect's error shape, a 200 stream ending with
`[DONE]`. Values nested around orjson's depth limit are tried in every place the server keeps them, at every
depth near the edge. Afterwards a healthy rollout still completes its turns and `/health` answers.

The server runs on its own event loop in a thread, started once for the module, so an example costs a few
blocking requests. Examples are derandomized: CI sends the same requests every time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.fakes import ScriptedUpstream
from tests.interceptor.fuzz_client import HttpClient, Outcome, run_case
from tests.interceptor.fuzz_inputs import (
    NESTING_DEPTHS,
    Case,
    Step,
    admin_case,
    chat_case,
    dialect_case,
    junk_case,
    models_case,
    nesting_cases,
    tools_case,
)
from tests.interceptor.fuzz_values import Credentials, Source

ADMIN_TOKEN = "admin-token-for-fuzzing"
FINISH = Case("finish", (Step("admin_finish", "POST", "/rollouts/{rid}/finish", "admin", b'{"status": "ok"}'),))


class ServedInThread:
    """The scripted upstream and an `InterceptionServer` on an event loop in a thread, for a blocking client."""

    def __init__(self, *, model_dir: Path, record_path: Path) -> None:
        self._model_dir, self._record_path = model_dir, record_path
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzzed-server", daemon=True)
        self._stop = asyncio.Event()
        self.server: InterceptionServer | None = None

    def __enter__(self) -> ServedInThread:
        self._thread.start()
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._serving = asyncio.run_coroutine_threadsafe(self._serve(started), self._loop)
        try:
            started.result(timeout=120)
        except BaseException:
            self._close_loop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._serving.result(timeout=30)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _serve(self, started: concurrent.futures.Future) -> None:
        try:
            async with ScriptedUpstream(self._model_dir) as upstream:
                config = ServerConfig(
                    upstream=UpstreamConfig(base_url=upstream.url, attempts=1),
                    model_dir=self._model_dir,
                    admin_token=ADMIN_TOKEN,
                    record_path=self._record_path,  # finishing writes the record: that path is fuzzed too
                    max_body_bytes=4 * 1024 * 1024,
                )
                async with InterceptionServer(config) as server:
                    self.server = server
                    started.set_result(None)
                    await self._stop.wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    def call(self, coroutine: Coroutine):
        """Run a coroutine on the server's loop (the Python API is not thread-safe) and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    @property
    def port(self) -> int:
        return int(self.server.url.rsplit(":", 1)[1])

    def open_rollout(self) -> Credentials:
        async def open_one():
            return self.server.open_rollout()

        handle = self.call(open_one())
        return Credentials(handle.id, handle.secret, handle.tools_secret, ADMIN_TOKEN)


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    with ServedInThread(model_dir=tiny_model_dir, record_path=tmp_path_factory.mktemp("fuzz") / "rollouts.jsonl") as s:
        yield s


@pytest.fixture(scope="module")
def client(served):
    client = HttpClient(served.port)
    yield client
    client.close()


class Drawn:
    """A `fuzz_values.Source` backed by Hypothesis, so failing cases shrink."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def choice(self, options):
        return self._data.draw(st.sampled_from(options))

    def integer(self, low: int, high: int) -> int:
        return self._data.draw(st.integers(low, high))


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same requests on every CI run
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


def check(served: ServedInThread, client: HttpClient, generate: Callable[[Source], Case], data) -> None:
    case = generate(Drawn(data))
    rollout = served.open_rollout()
    # the rollout is finished over HTTP too (a 404 if the case did it): its record must be writable whatever it got
    outcomes = run_case(client, case, rollout) + run_case(client, FINISH, rollout)
    assert not any(o.problem for o in outcomes), describe(case, outcomes)


def describe(case: Case, outcomes: list[Outcome]) -> str:
    """The scenario request by request, as sent, with each answer; the ones that break the contract marked."""
    lines = [f"input class {case.label!r}:"]
    for o in outcomes:
        body = o.step.body or b""
        why = f" ({o.problem})" if o.problem and not o.problem.isdigit() else ""
        lines.append(
            f"  {'!!' if o.problem else '  '} {o.step.method} {o.path[:120]} (auth: {o.step.auth}, "
            f"headers: {o.step.headers}) body ({len(body)} bytes): {body[:300]!r}\n"
            f"       -> {o.status}{why}: {o.body[:300]!r}"
        )
    return "\n".join(lines)


@fuzz_settings(examples=250)
@given(data=st.data())
def test_chat_requests_with_wrong_types_and_sizes_never_get_a_5xx(served, client, data):
    check(served, client, chat_case, data)


@fuzz_settings(examples=80)
@given(data=st.data())
def test_junk_bodies_headers_and_paths_on_the_chat_route_never_get_a_5xx(served, client, data):
    check(served, client, junk_case, data)


@fuzz_settings(examples=150)
@given(data=st.data())
def test_content_part_types_and_content_encodings_in_every_dialect_never_get_a_5xx(served, client, data):
    """A content part's or block's `type` of any JSON kind, and bodies with good and bad Content-Encoding headers
    (gzip and deflate that do not inflate, brotli, zstd, unknown codings), on the chat, Messages and Responses
    routes: a 4xx in that dialect's shape, never a 5xx."""
    check(served, client, dialect_case, data)


@fuzz_settings(examples=50)
@given(data=st.data())
def test_tools_route_never_gets_a_5xx_and_the_answer_is_recorded(served, client, data):
    check(served, client, tools_case, data)


@fuzz_settings(examples=30)
@given(data=st.data())
def test_models_route_never_gets_a_5xx(served, client, data):
    check(served, client, models_case, data)


@fuzz_settings(examples=100)
@given(data=st.data())
def test_admin_routes_never_get_a_5xx_and_what_they_open_works(served, client, data):
    check(served, client, admin_case, data)


@pytest.mark.parametrize("depth", NESTING_DEPTHS)
def test_values_nested_near_the_encoders_depth_limit_never_get_a_5xx(served, client, depth):
    """Every place a client's JSON is kept, at each depth around orjson's limit (a few draws would miss the edge)."""
    broken = []
    for case in nesting_cases(depth).values():
        rollout = served.open_rollout()
        outcomes = run_case(client, case, rollout) + run_case(client, FINISH, rollout)
        if any(o.problem for o in outcomes):
            broken.append(describe(case, outcomes))
    assert not broken, "\n".join(broken)


def test_after_the_fuzzing_a_healthy_rollout_completes_and_health_answers(served, client):
    """Runs last in this module: whatever the fuzzing left behind, normal service goes on."""
    admin = b"Bearer " + ADMIN_TOKEN.encode()
    opened = client.request("POST", "/rollouts", admin, b"{}")
    assert opened.status == 201, opened.body
    rollout = orjson.loads(opened.body)
    secret = b"Bearer " + rollout["secret"].encode()
    chat = f"/rollout/{rollout['id']}/v1/chat/completions"
    messages: list[dict] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    for turn in range(3):
        reply = client.request("POST", chat, secret, orjson.dumps({"model": "policy", "messages": messages}))
        assert reply.status == 200, reply.body
        messages += [orjson.loads(reply.body)["choices"][0]["message"], {"role": "user", "content": f"more {turn}"}]
    tools = b"Bearer " + rollout["tools_secret"].encode()
    answered = client.request("POST", f"/rollout/{rollout['id']}/v1/tools/answer", tools, b'{"answer": "42"}')
    assert answered.status == 200, answered.body
    finished = client.request("POST", f"/rollouts/{rollout['id']}/finish", admin, b'{"status": "ok", "reward": 1}')
    assert finished.status == 200, finished.body
    record = orjson.loads(finished.body)
    assert record["answer"] == "42" and len(record["samples"]) == 1 and len(record["samples"][0]["turns"]) == 3
    health = client.request("GET", "/health", None, None)
    assert health.status == 200 and orjson.loads(health.body)["status"] == "ok"
