"""`PolicyStack`: the one place `run`, `train` and `demo` open the policy server, the interception server and the
runner; it takes the local engine or policy replicas, and refuses a configuration that mixes them."""

from __future__ import annotations

import pytest

from trainer.engine import EngineConfig, LocalEngine
from trainer.policy_stack import PolicyStack, StackConfig


async def test_replica_urls_open_a_server_routing_over_all_of_them(tiny_model_dir):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0)) as one, \
            LocalEngine(EngineConfig(model=tiny_model_dir, port=0)) as two:
        config = StackConfig(upstream=(one.base_url, two.base_url), model=tiny_model_dir)
        async with PolicyStack(config) as stack:
            assert stack.engine is None and stack.runner is None
            assert [r.url for r in stack.server.replicas.replicas] == [one.base_url, two.base_url]
            assert stack.server.policy.max_model_len > 0
        assert stack.server.policy is not None  # the server was started and is now closed


async def test_the_local_engine_serves_the_given_model_in_the_given_dtype(tiny_model_dir):
    config = StackConfig(model=tiny_model_dir, build_local_model=False, engine_dtype="bfloat16")
    async with PolicyStack(config) as stack:
        assert stack.engine is not None and stack.engine.core.config.dtype == "bfloat16"
        assert stack.upstream.base_url == stack.engine.base_url


def test_local_and_urls_together_or_a_local_engine_without_a_model_are_refused():
    with pytest.raises(ValueError, match="not both"):
        StackConfig(upstream=("local", "http://127.0.0.1:8000"))
    with pytest.raises(ValueError, match="needs a model directory"):
        StackConfig(upstream=("local",))
    with pytest.raises(ValueError, match="at least one URL"):
        StackConfig(upstream=())


def test_the_upstream_is_parsed_once_from_a_string_or_a_list_and_refused_when_mixed():
    from trainer.train_main import TrainConfig
    from trainer.upstreams import parse_upstream

    assert parse_upstream("local") == ("local",)
    assert parse_upstream(" http://a:8000/v1 , http://b:8000 ") == ("http://a:8000/v1", "http://b:8000")
    assert parse_upstream(["http://a:8000"]) == ("http://a:8000",)
    for bad, words in [("", "at least one"), ("local,http://a:8000", "not both"), ("http://a:8000,,", "none empty"),
                       ([3], "URLs")]:
        with pytest.raises(ValueError, match=words):
            parse_upstream(bad)
    config = TrainConfig(tasks="t.jsonl", upstream="http://a:8000,http://b:8000")
    assert config.upstreams == ("http://a:8000", "http://b:8000") and not config.local
    assert TrainConfig(tasks="t.jsonl").local
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(tasks="t.jsonl", upstream="local,http://a:8000")
