"""The admin API, for a driver in another process: open, inspect and finish rollouts over HTTP.

    POST /rollouts                {"sampling": {...}, "metadata": {...}} -> {"id", "base_url", "secret", "tools_secret"}
    GET  /rollouts/{id}           -> status, answer, usage, events, upstream failures and the failure the rollout
                                     would be finished with now (no secret, no tokens)
    POST /rollouts/{id}/finish    {"status": "ok"|"failed"|"timeout", "failure": {"cause", "message"}, "reward": x,
                                   "accept_upstream_failures": "why"} -> the record. A rollout whose last chat call
                                  failed upstream is recorded `failed` (cause `upstream`, no reward) unless
                                  `accept_upstream_failures` says why the driver accepts it.

Guarded by `Authorization: Bearer <admin token>`; without an admin token configured the routes answer 404.
"""

from __future__ import annotations

import hmac
import math
from typing import TYPE_CHECKING

from aiohttp import web

from interceptor.config import SamplingSettings
from interceptor.errors import BadRequest, ConfigError, NotFound, Unauthorized, json_response
from interceptor.gate.stop_rules import parse_stop_rules
from interceptor.store.records import Failure
from interceptor.wire.protocol import ensure_serialisable, parse_json_body
from interceptor.wire.request_body import read_body

if TYPE_CHECKING:
    from interceptor.server import InterceptionServer

__all__ = ["add_admin_routes", "authorize_admin"]

_STATUSES = ("ok", "failed", "timeout", "interrupted")


def authorize_admin(request: web.Request, token: str | None) -> None:
    """404 when no admin token is configured (the admin API is off), 401 for any other credential."""
    if token is None:
        raise NotFound("the admin API is off (no admin token configured)")
    presented = request.headers.get("Authorization", "")
    # surrogateescape: non-ASCII bytes in the header are compared (and rejected), never an encoding error
    if not hmac.compare_digest(presented.encode(errors="surrogateescape"), f"Bearer {token}".encode()):
        raise Unauthorized("invalid admin token")


def add_admin_routes(app: web.Application, server: InterceptionServer) -> None:
    def authorize(request: web.Request) -> None:
        authorize_admin(request, server.config.admin_token)

    async def open_rollout(request: web.Request) -> web.Response:
        authorize(request)
        raw = await read_body(request, server.body_limits)
        body = parse_json_body(raw) if raw.strip() else {}
        unknown = set(body) - {"sampling", "metadata", "stop_rules"}
        if unknown:
            raise BadRequest(f"unknown fields {sorted(unknown)[:10]}; POST /rollouts takes sampling, metadata and "
                             "stop_rules")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise BadRequest("metadata must be an object", param="metadata")
        ensure_serialisable(metadata, "metadata")
        sampling = body.get("sampling") or {}
        if not isinstance(sampling, dict):
            raise BadRequest("sampling must be an object", param="sampling")
        try:
            sampling = SamplingSettings.from_dict(sampling)
        except (ConfigError, TypeError) as exc:
            raise BadRequest(f"sampling: {exc}"[:500], param="sampling") from exc
        stop_rules = parse_stop_rules(body.get("stop_rules"))
        handle = server.open_rollout(sampling=sampling, metadata=metadata, stop_rules=stop_rules)
        return json_response(
            {"id": handle.id, "base_url": handle.base_url, "secret": handle.secret, "tools_secret": handle.tools_secret},
            status=201,
        )

    async def show_rollout(request: web.Request) -> web.Response:
        authorize(request)
        rollout_id = request.match_info["rid"]
        finished = server.registry.finished_status(rollout_id)
        if finished is not None:
            return json_response({"id": rollout_id, "status": finished, "finished": True})
        rollout = server.registry.get(rollout_id)
        failure = rollout.failure
        return json_response(
            {
                "id": rollout.id,
                "status": rollout.status,
                "finished": False,
                "answered": rollout.answered,
                "turns": len(rollout.trace),
                "usage": {"prompt_tokens": rollout.prompt_tokens, "completion_tokens": rollout.completion_tokens},
                "upstream_failures": rollout.upstream_failures,
                "trailing_upstream_failures": rollout.trailing_upstream_failures,
                "failure": {"cause": failure.cause, "message": failure.message} if failure else None,
                "events": rollout.events,
                "metadata": rollout.metadata,
            }
        )

    async def finish_rollout(request: web.Request) -> web.Response:
        authorize(request)
        raw = await read_body(request, server.body_limits)
        body = parse_json_body(raw) if raw.strip() else {}
        unknown = set(body) - {"status", "failure", "reward", "accept_upstream_failures"}
        if unknown:
            raise BadRequest(f"unknown fields {sorted(unknown)[:10]}; finish takes status, failure, reward and "
                             "accept_upstream_failures")
        status = body.get("status", "ok")
        if not isinstance(status, str) or status not in _STATUSES:
            raise BadRequest(f"status must be one of {_STATUSES}", param="status")
        accept = body.get("accept_upstream_failures")
        if accept is not None and not (isinstance(accept, str) and accept.strip()):
            raise BadRequest("accept_upstream_failures must be a non-empty string saying why",
                             param="accept_upstream_failures")
        failure = body.get("failure")
        if failure is not None and not (
            isinstance(failure, dict) and isinstance(failure.get("cause"), str) and isinstance(failure.get("message"), str)
        ):
            raise BadRequest("failure must be {'cause': str, 'message': str}", param="failure")
        record, record_json = await server.finish(
            request.match_info["rid"],
            status=status,
            failure=Failure(cause=failure["cause"], message=failure["message"]) if failure else None,
            reward=_reward(body.get("reward")),
            accept_upstream_failures=accept,
        )
        return web.Response(body=record_json or record.to_json(), content_type="application/json")

    app.router.add_post("/rollouts", open_rollout)
    app.router.add_get("/rollouts/{rid}", show_rollout)
    app.router.add_post("/rollouts/{rid}/finish", finish_rollout)


def _reward(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest("reward must be a finite number", param="reward")
    return float(value)
