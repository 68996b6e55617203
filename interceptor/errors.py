"""Error types of the interceptor, and the one place they become HTTP responses.

Every error a client can cause is an `ApiError` subclass with its HTTP status and OpenAI error `type`/`code`.
`error_body` renders the OpenAI shape `{"error": {"message", "type", "param", "code"}}`; the server's middleware
is the only caller that turns exceptions into responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "ApiError",
    "BadRequest",
    "ConfigError",
    "ContextLengthExceeded",
    "Conflict",
    "NotFound",
    "PayloadTooLarge",
    "Unauthorized",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "error_body",
]


class ConfigError(ValueError):
    """A configuration value is invalid (raised at start-up, never mapped to a response)."""


@dataclass(eq=False)
class ApiError(Exception):
    message: str
    param: str | None = None
    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        super().__init__(self.message)


class BadRequest(ApiError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(ApiError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class Conflict(ApiError):
    status = 409
    type = "invalid_request_error"
    code = "rollout_finished"


class PayloadTooLarge(ApiError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UpstreamError(ApiError):
    """The policy server answered with an error we cannot pass on as the client's fault."""

    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamUnavailable(UpstreamError):
    status = 503
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


def error_body(error: ApiError) -> dict:
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }
