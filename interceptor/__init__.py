"""Interceptor: per-rollout OpenAI endpoints for unmodified agents, recording token-exact training samples.

The public names are loaded on first use, so `import interceptor` (and the CLI) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = [
    "Failure",
    "InterceptionServer",
    "RolloutHandle",
    "RolloutRecord",
    "SampleRecord",
    "SamplingSettings",
    "ServerConfig",
    "TurnRecord",
    "UpstreamConfig",
    "read_records",
]

_HOMES = {
    "InterceptionServer": "server",
    "RolloutHandle": "server",
    "SamplingSettings": "config",
    "ServerConfig": "config",
    "UpstreamConfig": "config",
    "Failure": "store.records",
    "RolloutRecord": "store.records",
    "SampleRecord": "store.records",
    "TurnRecord": "store.records",
    "read_records": "store.recorder",
}

if TYPE_CHECKING:
    from interceptor.config import SamplingSettings, ServerConfig, UpstreamConfig
    from interceptor.server import InterceptionServer, RolloutHandle
    from interceptor.store.recorder import read_records
    from interceptor.store.records import Failure, RolloutRecord, SampleRecord, TurnRecord


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'interceptor' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
