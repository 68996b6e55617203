"""Fixtures for the tests that run `interceptor serve` as a child process over the scripted upstream."""

from __future__ import annotations

import functools
import secrets
from pathlib import Path

import pytest

from tests.interceptor.serve_process import serve_process


@pytest.fixture
def record_path(tmp_path) -> Path:
    return tmp_path / "rollouts.jsonl"


@pytest.fixture
def launch(scripted, tiny_model_dir, tmp_path, record_path):
    """`launch()` starts `interceptor serve` on the record file: each call is a new process, a restart."""
    return functools.partial(
        serve_process,
        upstream_url=scripted.url,
        model_dir=tiny_model_dir,
        record_path=record_path,
        workdir=tmp_path,
        admin_token=secrets.token_urlsafe(24),
    )
