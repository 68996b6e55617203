"""Error types of the interceptor, and the one place they become HTTP responses.

Every error a client can cause is an `ApiError` subclass with its HTTP status and OpenAI error `type`/`code`.
`error_body` renders the OpenAI shape `{"error": {"message", "type", "param", "code"}}`; `errors_middleware`,
installed on the server's app, is the one place exceptions become responses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

__all__ = [
    "ApiError",
    "BadRequest",
    "ConfigError",
    "Conflict",
    "ContextLengthExceeded",
    "ErrorShape",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTimeout",
    "Unauthorized",
    "UnsupportedMediaType",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "WorkerUnavailable",
    "error_body",
    "error_answer",
    "errors_middleware",
    "errors_middleware_for",
    "json_response",
    "openai_error",
]

log = logging.getLogger("interceptor.server")


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
    prompt_tokens: int | None = None  # set by the gate: what Anthropic's "prompt is too long: N tokens > M" says
    limit: int | None = None


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


class UnsupportedMediaType(ApiError):
    """A request body in a content coding the server does not undo (brotli, zstd, a name it does not know)."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class UpstreamError(ApiError):
    """The policy server answered with an error we cannot pass on as the client's fault."""

    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamUnavailable(UpstreamError):
    status = 503
    code = "upstream_unavailable"


class WorkerUnavailable(ApiError):
    """`serve --workers N`: the worker holding a rollout (or every worker) is down."""

    status = 503
    type = "server_error"
    code = "worker_unavailable"


class Overloaded(ApiError):
    """The server's own limit, not the upstream's: request bodies in flight past `max_pending_body_bytes`."""

    status = 503
    type = "server_error"
    code = "overloaded"


class RequestTimeout(ApiError):
    """A request's body did not arrive whole within `body_timeout_s`."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


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


def json_response(data: object, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


ErrorShape = Callable[[web.Request, ApiError], tuple[int, dict]]  # an error's status and body for this request


def openai_error(request: web.Request, error: ApiError) -> tuple[int, dict]:
    return error.status, error_body(error)


def error_answer(shape: ErrorShape, request: web.Request, error: Exception,
                 status: int | None = None) -> tuple[int, dict, dict | None]:
    """The status, body and extra headers that answer `error`, in the shape the request's client expects. An error
    that is not an `ApiError` is a defect: it is logged with its traceback and answered as an internal error. The
    error middleware and the fast lane (`lane.py`) both answer through this."""
    if not isinstance(error, ApiError):
        log.error("unhandled error on %s %s", request.method, request.path, exc_info=error)
        error = ApiError("internal error; the server log has the details")
    code, body = shape(request, error)
    code = status or code
    return code, body, ({"Retry-After": "1"} if code in (429, 503, 529) else None)


def errors_middleware_for(shape: ErrorShape = openai_error):
    """The one place errors become responses, each in the shape the request's client expects (`shape`)."""

    def respond(request: web.Request, error: Exception, status: int | None = None) -> web.Response:
        code, body, headers = error_answer(shape, request, error, status)
        return json_response(body, status=code, headers=headers)

    @web.middleware
    async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return respond(request, exc)
        except RequestPayloadError as exc:  # a body that cannot be read: bad chunking, a connection cut short
            return respond(request, BadRequest(f"the request body could not be read: {exc}"[:500]))
        except web.HTTPRequestEntityTooLarge as exc:
            return respond(request, PayloadTooLarge(f"request body too large: {exc.text}"))
        except web.HTTPException as exc:  # router-level 404/405
            if exc.status < 400:
                raise
            if exc.status == 404:
                return respond(request, NotFound(f"{request.method} {request.path} is not an endpoint here"))
            return respond(request, BadRequest(f"{request.method} is not allowed on {request.path}"), exc.status)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # the top-level capture point: a defect, logged with its traceback, answered in shape
            return respond(request, exc)

    return errors_middleware


errors_middleware = errors_middleware_for()
