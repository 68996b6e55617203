"""`GET /metrics`: what an operator scrapes from a running interception server, in Prometheus' text format: turns
by mode and dialect, tokens, upstream time per replica, finished rollouts by status and cause, live state."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.fakes import Fault


def samples(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def chat(http, handle, content: str, *, stream: bool = False) -> int:
    body = {"model": "policy", "messages": [{"role": "user", "content": content}], "stream": stream}
    async with http.post(handle.base_url + "/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {handle.secret}"}) as response:
        await response.read()
        return response.status


async def test_turns_tokens_latency_and_finished_rollouts_are_counted(scripted, tiny_model_dir):
    scripted.script("first reply", "second reply", Fault(status=500), Fault(status=500), Fault(status=500),
                    Fault(status=500))
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url, backoff_initial_s=0.001),
                          model_dir=tiny_model_dir)
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        ok, failing = server.open_rollout(), server.open_rollout()
        assert await chat(http, ok, "hello") == 200
        assert await chat(http, ok, "again", stream=True) == 200
        assert await chat(http, failing, "this one fails upstream") == 503
        await server.finish_rollout(ok.id, reward=1.0)
        await server.finish_rollout(failing.id)  # its last call failed upstream: failed, cause upstream
        async with http.get(server.url + "/metrics") as response:
            assert response.status == 200 and response.content_type == "text/plain"
            scraped = samples(await response.text())
    assert scraped[("interceptor_turns_total", (("dialect", "chat"), ("mode", "interception_gate")))] == 2
    assert scraped[("interceptor_sampled_tokens_total", ())] > 0
    assert scraped[("interceptor_prompt_tokens_total", ())] > 0
    replica = (("replica", scripted.url),)
    assert scraped[("interceptor_upstream_seconds_count", replica)] == 2
    assert scraped[("interceptor_rollouts_finished_total", (("cause", ""), ("status", "ok")))] == 1
    assert scraped[("interceptor_rollouts_finished_total", (("cause", "upstream"), ("status", "failed")))] == 1
    assert scraped[("interceptor_live_rollouts", ())] == 0
    assert scraped[("interceptor_policy_version", ())] == 0
    assert scraped[("interceptor_replica_healthy", replica)] == 1


async def test_metrics_ask_for_the_admin_token_when_one_is_configured(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          admin_token="operator-token")
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        async with http.get(server.url + "/metrics") as response:
            assert response.status == 401
        async with http.get(server.url + "/metrics", headers={"Authorization": "Bearer operator-token"}) as response:
            assert response.status == 200
            assert "interceptor_live_rollouts 0.0" in await response.text()


async def test_changes_refused_before_grading_and_limits_boxes_hit_are_counted_by_kind(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        for counts in ({"test": 2, "shadowing": 1}, {"test": 1}):
            handle = server.open_rollout()
            server.rollout(handle.id).note("tampering", refused=[], counts=counts, total=sum(counts.values()))
            server.rollout(handle.id).note("limit_hit", limit="egress", count=counts["test"])
            await server.finish_rollout(handle.id, reward=0.0)
        async with http.get(server.url + "/metrics") as response:
            scraped = samples(await response.text())
    assert scraped[("interceptor_tampering_total", (("kind", "test"),))] == 3
    assert scraped[("interceptor_tampering_total", (("kind", "shadowing"),))] == 1
    assert scraped[("interceptor_limits_hit_total", (("limit", "egress"),))] == 3
