"""`DIALECTS` is the one list of dialects: every dialect in it is routed (by aiohttp and by the fast lane), answers
errors on its paths in its own shape, and has a relay shape for black_box. A dialect added to the registry and
missing any of these fails here, not at an agent's first request."""

from __future__ import annotations

import aiohttp
import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.errors import Unauthorized
from interceptor.relay.shapes import RELAY_SHAPES
from interceptor.wire.dialects.registry import DEFAULT_DIALECT, DIALECTS, dialect_for_path


def test_every_dialect_has_a_relay_shape_and_nothing_else_does():
    assert set(RELAY_SHAPES) == {dialect.name for dialect in DIALECTS}


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_the_paths_under_a_dialects_endpoint_are_its_own(dialect):
    assert dialect_for_path(f"/rollout/r-1/v1/{dialect.path}") is dialect
    assert dialect_for_path(f"/rollout/r-1/v1/{dialect.path}/count_tokens") is dialect


def test_a_path_no_dialect_owns_gets_the_default():
    assert dialect_for_path("/rollouts/r-1/finish") is DEFAULT_DIALECT
    assert dialect_for_path("/health") is DEFAULT_DIALECT


@pytest.mark.parametrize("fast_lane", [True, False], ids=["fast_lane", "aiohttp"])
async def test_every_registered_dialect_is_routed_and_refuses_a_wrong_key_in_its_own_shape(
        scripted, tiny_model_dir, fast_lane):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          fast_lane=fast_lane)
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        rollout = server.open_rollout()
        for dialect in DIALECTS:
            headers = {"Authorization": "Bearer not-the-secret", "x-api-key": "not-the-secret"}
            async with http.post(f"{rollout.base_url}/{dialect.path}", json={}, headers=headers) as response:
                status, body = response.status, await response.json(content_type=None)
            _, expected = dialect.error(Unauthorized("x"))
            assert status == 401, (dialect.name, body)
            assert set(body) == set(expected) and set(body["error"]) == set(expected["error"]), (dialect.name, body)
