"""Shared fixtures: a tiny model and the embedded default policy (the tiny model trained to call tools), each built
once per session, and a scripted policy server for fault injection."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ci_skips import pytest_runtest_makereport  # noqa: F401  (under CI a skip fails: tests/ci_skips.py)
from tests.fakes import ScriptedUpstream
from tests.vllm_fixtures import vllm_server  # noqa: F401  (session-scoped real vLLM, for tests marked `vllm`)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from trainer.models.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory) -> Path:
    """The embedded default, built as `--upstream local` builds it (trainer.models.local_model): the policy the end-to-end
    tests run real agents against, and the model tests/trainer/test_tool_model.py examines."""
    from trainer.models.local_model import ensure_local_model

    return ensure_local_model(tmp_path_factory.mktemp("models") / "tool-calling")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct, imported through the command line as a user would (`make-model smollm2`)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("models") / "smollm2"
    done = subprocess.run([sys.executable, "-m", "interceptor.cli", "make-model", "smollm2", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture
async def scripted(tiny_model_dir) -> ScriptedUpstream:
    async with ScriptedUpstream(tiny_model_dir) as upstream:
        yield upstream
