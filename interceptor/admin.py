"""The admin API, for a driver in another process: open, inspect and finish rollouts over HTTP.

    POST /rollouts                {"sampling": {...}, "metadata": {...}} -> {"id", "base_url", "secret", "tools_secret"}
    GET  /rollouts/{id}           -> status, answer, usage, events (no secret, no tokens)
    POST /rollouts/{id}/finish    {"status": "ok"|"failed"|"timeout", "failure": {"cause", "message"}, "reward": x}
                                  -> the record

Guarded by `Authorization: Bearer <admin token>`; without an admin token configured the routes answer 404.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from .config import SamplingSettings
from .errors import BadRequest, ConfigError, NotFound, Unauthorized
from .protocol import parse_json_body
from .records import Failure

if TYPE_CHECKING:
    from .server import InterceptionServer

__all__ = ["add_admin_routes"]

_STATUSES = ("ok", "failed", "timeout")


def add_admin_routes(app: web.Application, server: InterceptionServer) -> None:
    def authorize(request: web.Request) -> None:
        token = server.config.admin_token
        if token is None:
            raise NotFound("the admin API is off (no admin token configured)")
        presented = request.headers.get("Authorization", "")
        if not hmac.compare_digest(presented.encode(), f"Bearer {token}".encode()):
            raise Unauthorized("invalid admin token")

    async def open_rollout(request: web.Request) -> web.Response:
        authorize(request)
        raw = await request.read()
        body = parse_json_body(raw) if raw.strip() else {}
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise BadRequest("metadata must be an object", param="metadata")
        try:
            sampling = SamplingSettings.from_dict(body.get("sampling") or {})
        except (ConfigError, TypeError) as exc:
            raise BadRequest(f"sampling: {exc}", param="sampling") from exc
        handle = server.open_rollout(sampling=sampling, metadata=metadata)
        return _json(
            {"id": handle.id, "base_url": handle.base_url, "secret": handle.secret, "tools_secret": handle.tools_secret},
            status=201,
        )

    async def show_rollout(request: web.Request) -> web.Response:
        authorize(request)
        rollout_id = request.match_info["rid"]
        if server.registry.is_finished(rollout_id):
            return _json({"id": rollout_id, "status": "finished"})
        rollout = server.rollout(rollout_id)
        return _json(
            {
                "id": rollout.id,
                "status": rollout.status,
                "answered": rollout.answered,
                "turns": len(rollout.trace),
                "usage": {"prompt_tokens": rollout.prompt_tokens, "completion_tokens": rollout.completion_tokens},
                "events": rollout.events,
                "metadata": rollout.metadata,
            }
        )

    async def finish_rollout(request: web.Request) -> web.Response:
        authorize(request)
        raw = await request.read()
        body = parse_json_body(raw) if raw.strip() else {}
        status = body.get("status", "ok")
        if status not in _STATUSES:
            raise BadRequest(f"status must be one of {_STATUSES}", param="status")
        failure = body.get("failure")
        if failure is not None and not (
            isinstance(failure, dict) and isinstance(failure.get("cause"), str) and isinstance(failure.get("message"), str)
        ):
            raise BadRequest("failure must be {'cause': str, 'message': str}", param="failure")
        record = await server.finish_rollout(
            request.match_info["rid"],
            status=status,
            failure=Failure(cause=failure["cause"], message=failure["message"]) if failure else None,
            reward=_reward(body.get("reward")),
        )
        return _json(record.to_json_dict())

    app.router.add_post("/rollouts", open_rollout)
    app.router.add_get("/rollouts/{rid}", show_rollout)
    app.router.add_post("/rollouts/{rid}/finish", finish_rollout)


def _reward(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest("reward must be a number", param="reward")
    return float(value)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
