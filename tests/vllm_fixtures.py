"""pytest fixtures for tests that talk to a real vLLM (marked `vllm`).

`vllm_server` starts one vLLM for the whole session on the session's tiny model (`tiny_model_dir` from
tests/conftest.py) and yields a `VllmServer`. Without the vLLM venv it skips, or fails under CI (see
`tests.vllm_server.require_vllm_python`). A test that changes the server's weights must put them back.

Wired in by `from tests.vllm_fixtures import vllm_server` in tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.vllm_server import VllmServer, require_vllm_python, start_vllm

__all__ = ["vllm_server"]


# loop_scope="session": the server outlives every test's event loop. Tests on their own loops may use it; it holds
# no loop-bound object, only a URL.
@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_server(request: pytest.FixtureRequest, tmp_path_factory) -> AsyncIterator[VllmServer]:
    python = require_vllm_python()
    # Asked for only now, so that a missing venv skips before the tiny model is built.
    model_dir: Path = request.getfixturevalue("tiny_model_dir")
    async with start_vllm(model_dir, python=python, log_dir=tmp_path_factory.mktemp("vllm")) as server:
        yield server
