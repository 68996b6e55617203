"""Fixtures for the local engine's tests: the session's tiny model, a reference copy of it for teacher-forced checks,
and an engine with its HTTP server on port 0 per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import torch

from trainer.engine import EngineConfig, LocalEngine


@pytest.fixture(scope="session")
def reference_model(tiny_model_dir: Path):
    """An independent copy of the engine's model, for teacher-forced forward passes in the test's own thread."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def engine_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
async def engine(tiny_model_dir: Path) -> AsyncIterator[LocalEngine]:
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, max_batch_size=8)) as running:
        yield running


@pytest.fixture
async def http(engine: LocalEngine) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=engine.base_url, timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session
