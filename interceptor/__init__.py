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
    "Failure": "records",
    "RolloutRecord": "records",
    "SampleRecord": "records",
    "TurnRecord": "records",
    "read_records": "recorder",
}

if TYPE_CHECKING:
    from .config import SamplingSettings, ServerConfig, UpstreamConfig
    from .recorder import read_records
    from .records import Failure, RolloutRecord, SampleRecord, TurnRecord
    from .server import InterceptionServer, RolloutHandle


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'interceptor' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
