"""Error types of the local engine, and the one place they become HTTP responses.

Responses use vLLM's OpenAI server shape: `{"error": {"message", "type", "param", "code"}}` with `type` the error
class name (`BadRequestError`, ...) and `code` the HTTP status as an integer. An `InvalidRequest` renders its message
as vLLM's `VLLMValidationError` does: the text, then `(parameter=..., value=...)` when those are known.
Errors raised by `interceptor.wire.protocol` (the chat endpoint's parser) are mapped here too, so every 400 looks alike.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from aiohttp import web

from interceptor.errors import ApiError

__all__ = [
    "EngineError",
    "EngineStopped",
    "GenerationFailed",
    "InvalidRequest",
    "NotFound",
    "error_body",
    "error_response",
]


class EngineError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "InternalServerError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def param(self) -> str | None:
        return None


class InvalidRequest(EngineError, ValueError):
    """The client sent something the engine cannot serve (HTTP 400)."""

    status = 400
    type = "BadRequestError"

    def __init__(self, message: str, *, param: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self._param = param
        self.value = value

    @property
    def param(self) -> str | None:
        return self._param

    def __str__(self) -> str:
        extras = [f"{name}={value}" for name, value in (("parameter", self._param), ("value", self.value))
                  if value is not None]
        return f"{self.message} ({', '.join(extras)})" if extras else self.message


class NotFound(EngineError):
    status = 404
    type = "NotFoundError"


class EngineStopped(EngineError):
    """The engine is shutting down and takes no more work."""

    status = 503
    type = "ServiceUnavailableError"


class GenerationFailed(EngineError):
    """The model failed while running a step; the requests in that step are failed, the engine keeps serving."""


def error_body(error: EngineError | ApiError) -> dict:
    if isinstance(error, ApiError):  # interceptor.wire.protocol's errors: same shape, vLLM's type names
        kind, message = _VLLM_TYPES.get(error.status, "BadRequestError"), error.message
    else:
        kind, message = error.type, str(error)
    return {"error": {"message": message, "type": kind, "param": error.param, "code": error.status}}


def error_response(error: EngineError | ApiError) -> web.Response:
    return web.Response(
        status=error.status, body=orjson.dumps(error_body(error)), content_type="application/json"
    )


_VLLM_TYPES = {400: "BadRequestError", 404: "NotFoundError", 413: "BadRequestError"}
