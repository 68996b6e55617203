"""Typed keys of the engine's aiohttp application state (shared by the handlers in `server.py` and `chat.py`)."""

from __future__ import annotations

from aiohttp import web

from trainer.engine.core import EngineCore
from trainer.engine.textcodec import TokenTexts

__all__ = ["CORE", "STARTED_AT", "TEXTS"]

CORE = web.AppKey("core", EngineCore)
TEXTS = web.AppKey("texts", TokenTexts)
STARTED_AT = web.AppKey("started_at", int)
