"""Shared fixtures: a tiny model built once per session, and a scripted policy server for fault injection."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import ScriptedUpstream
from tests.vllm_fixtures import vllm_server  # noqa: F401  (session-scoped real vLLM, for tests marked `vllm`)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from trainer.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture
async def scripted(tiny_model_dir) -> ScriptedUpstream:
    async with ScriptedUpstream(tiny_model_dir) as upstream:
        yield upstream
