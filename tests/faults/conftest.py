"""Fixtures for the fault matrix: one tokenizer per session, a fault-injecting upstream and a fresh interception
server per test (both start in milliseconds), with small timeouts so the whole matrix runs in about a minute."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from transformers import AutoTokenizer

from interceptor import ServerConfig, UpstreamConfig
from tests.faults.agent import ADMIN_TOKEN
from tests.faults.upstream import FaultUpstream

# Retries back off for 10-20 ms, not seconds; a generation may take 5 s before it counts as stalled (the stall
# cases shorten this); connecting to localhost either works at once or is refused.
UPSTREAM_DEFAULTS = {
    "attempts": 4,
    "backoff_initial_s": 0.01,
    "backoff_max_s": 0.02,
    "request_timeout_s": 5.0,
    "connect_timeout_s": 0.5,
}
# A stream waits 0.5 s for the turn before it answers 200 and sends keepalives every 0.2 s.
SERVER_DEFAULTS = {
    "admin_token": ADMIN_TOKEN,
    "stream_hold_s": 0.5,
    "keepalive_s": 0.2,
    "shutdown_grace_s": 0.3,
}


def gate_config(
    upstream_url: str, model_dir: Path, record_path: Path, *, upstream: dict | None = None, **server
) -> ServerConfig:
    """An interception_gate configuration with the fast test defaults, overridden by `upstream` and `server`."""
    upstream_config = UpstreamConfig(**{**UPSTREAM_DEFAULTS, "base_url": upstream_url, **(upstream or {})})
    return ServerConfig(
        **{**SERVER_DEFAULTS, "upstream": upstream_config, "model_dir": model_dir, "record_path": record_path, **server}
    )


def black_box_config(upstream_url: str, record_path: Path, **server) -> ServerConfig:
    """A black_box configuration (the chat request relayed as it came) with the fast test defaults."""
    upstream_config = UpstreamConfig(**{**UPSTREAM_DEFAULTS, "base_url": upstream_url})
    return ServerConfig(
        **{**SERVER_DEFAULTS, "mode": "black_box", "upstream": upstream_config, "record_path": record_path, **server}
    )


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture
async def upstream(tokenizer) -> FaultUpstream:
    async with FaultUpstream(tokenizer) as upstream:
        yield upstream


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
