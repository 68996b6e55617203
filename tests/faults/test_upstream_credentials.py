"""Credentials for the upstream: a configuration that cannot work is refused at start, and a request the HTTP client
will not make is an upstream failure, never a 500 and never a rewarded rollout.

- credentials in an upstream URL (`user:password@`) beside an API key: both would be the one Authorization header
  (Basic and Bearer), so `UpstreamConfig` refuses the pair at start, for the base URL and for a replica;
- URL credentials alone go out as Basic authentication and the turn works;
- a request the client refuses to make (URL credentials aiohttp cannot encode: it writes Basic credentials in
  latin-1): 502 in the agent's dialect, no turn recorded, and finishing the rollout with a reward afterwards records
  it failed, cause upstream, with no reward. In both modes, over the three dialects, streamed and not.
"""

from __future__ import annotations

import base64
import logging

import pytest

from interceptor import InterceptionServer, UpstreamConfig, read_records
from interceptor.cli import main
from interceptor.errors import ConfigError
from tests.faults import test_fault_matrix_messages as messages_matrix
from tests.faults import test_fault_matrix_responses as responses_matrix
from tests.faults.agent import Answer, chat, finish
from tests.faults.conftest import black_box_config, gate_config
from tests.faults.scenario import FIRST_MESSAGES, assert_openai_error, request

UNENCODABLE = "user:p%E2%9C%93@"  # the password "p✓": not latin-1


def with_credentials(url: str, credentials: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{credentials}{rest}"


@pytest.mark.parametrize("where", ["base_url", "replica"])
def test_credentials_in_an_upstream_url_beside_an_api_key_are_refused_at_start(where):
    urls = {"base_url": "http://127.0.0.1:8000", "replicas": ("http://127.0.0.1:8001",)}
    if where == "base_url":
        urls["base_url"] = "http://user:secret@127.0.0.1:8000"
    else:
        urls["replicas"] = ("http://user:secret@127.0.0.1:8001",)
    with pytest.raises(ConfigError, match="credentials .* and an API key") as refused:
        UpstreamConfig(**urls, api_key="sk-upstream")
    assert "secret" not in str(refused.value)
    UpstreamConfig(**urls)  # the URL's credentials alone are fine
    UpstreamConfig(**urls, api_key="")  # an empty key is no key


def test_interceptor_serve_says_why_it_refuses_credentials_in_the_url_beside_an_api_key(monkeypatch, capsys):
    monkeypatch.setenv("INTERCEPTOR_UPSTREAM_API_KEY", "sk-upstream")
    assert main(["serve", "--mode", "black_box", "--upstream", "http://user:secret@127.0.0.1:8000"]) == 2
    error = capsys.readouterr().err
    assert "interceptor serve: error:" in error and "an API key" in error and "secret" not in error, error


@pytest.mark.parametrize("key", ["sk-\nInjected: 1", "sk-é", "sk-✓"])
def test_an_api_key_that_cannot_be_a_header_is_refused_at_start(key):
    with pytest.raises(ConfigError, match="visible ASCII"):
        UpstreamConfig(base_url="http://127.0.0.1:8000", api_key=key)


async def test_url_credentials_alone_go_out_as_basic_authentication(upstream, tiny_model_dir, tmp_path, http):
    url = with_credentials(upstream.url, "user:pass@")
    config = gate_config(url, tiny_model_dir, tmp_path / "rollouts.jsonl", upstream={"model": "faulty"},
                         max_model_len=4096)
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        answer = await chat(http, handle.base_url, handle.secret, body=request(FIRST_MESSAGES, False))
    assert answer.status == 200, answer.raw
    assert upstream.authorizations == [f"Basic {base64.b64encode(b'user:pass').decode()}"]


async def _turn(http, handle, dialect: str, stream: bool) -> Answer:
    if dialect == "messages":
        return await messages_matrix.messages_call(http, handle, list(FIRST_MESSAGES), stream)
    if dialect == "responses":
        return await responses_matrix.responses_call(http, handle, [responses_matrix.QUESTION], stream)
    return await chat(http, handle.base_url, handle.secret, body=request(FIRST_MESSAGES, stream))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", ["chat", "messages", "responses"])
@pytest.mark.parametrize("mode", ["interception_gate", "black_box"])
async def test_a_request_the_http_client_will_not_make_is_a_502_and_the_rollout_is_not_rewarded(
        mode, dialect, stream, upstream, tiny_model_dir, tmp_path, http, caplog):
    record_path = tmp_path / "rollouts.jsonl"
    url = with_credentials(upstream.url, UNENCODABLE)
    if mode == "black_box":
        config = black_box_config(url, record_path)
    else:  # the model and its context are given: discovering them at start would fail the same way
        config = gate_config(url, tiny_model_dir, record_path, upstream={"model": "faulty"}, max_model_len=4096)
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        answer = await _turn(http, handle, dialect, stream)
        finish_http, finished = await finish(http, server.url, handle.id, {"reward": 1})

    assert answer.status == 502, answer.raw[:600]
    if dialect == "messages":
        assert messages_matrix.error_of(answer)["type"] == "api_error"
        message = messages_matrix.error_of(answer)["message"]
    else:
        assert_openai_error(answer, "bad_gateway")
        message = answer.error["message"]
    assert "could not be made" in message and "p✓" not in message, message
    assert upstream.attempts == 0  # never sent, and never retried
    assert finish_http == 200 and finished["status"] == "failed" and finished["reward"] is None, finished
    assert finished["failure"]["cause"] == "upstream", finished
    [on_disk] = read_records(record_path)
    assert on_disk.status == "failed" and on_disk.reward is None and on_disk.failure.cause == "upstream"
    assert all(sum(sample.completion_mask) == 0 for sample in on_disk.samples)  # no turn recorded
    assert not any("response" in entry for entry in on_disk.trace), on_disk.trace  # nor a relayed answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "unhandled" in r.getMessage()]
    assert any("could not be made" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
