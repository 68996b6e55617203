"""The viewer's web application: a page, its static files, and a small JSON API over a `RecordIndex`.

    GET /                      the page (no build step: plain HTML, CSS and JavaScript from `static/`)
    GET /api/run               the run's summary (`query.run_summary`)
    GET /api/rollouts?...      a filtered, sorted page of rollouts (`query.RolloutQuery` says which parameters)
    GET /api/rollouts/{key}    one rollout in full, by its key or its rollout id (`detail.rollout_detail`)
    GET /api/events            Server-Sent Events: `{"version", "rollouts", "steps"}` each time the files grow

The index is refreshed every `poll_s` seconds in a worker thread, so an application mounted beside the interception
server never stalls a rollout while it reads. With a `token`, every route wants it, as `?token=` (which also sets a
cookie, so links keep working) or `Authorization: Bearer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from pathlib import Path

import orjson
from aiohttp import web

from interceptor.errors import ApiError, NotFound, Unauthorized, errors_middleware_for, json_response
from interceptor.viewer.detail import TokenText, rollout_detail
from interceptor.viewer.index import RecordIndex
from interceptor.viewer.query import RolloutQuery, page, run_summary

__all__ = ["viewer_app"]

STATIC = Path(__file__).parent / "static"
_COOKIE = "interceptor_view"
_HEARTBEAT_S = 15.0
_INDEX = web.AppKey("index", RecordIndex)
_TEXT = web.AppKey("text", TokenText)
_CHANGED = web.AppKey("changed", asyncio.Condition)


def _viewer_error(request: web.Request, error: ApiError) -> tuple[int, dict]:
    return error.status, {"error": {"message": error.message, "type": error.type}}


def viewer_app(index: RecordIndex, text: TokenText | None = None, *, poll_s: float = 1.0,
               token: str | None = None) -> web.Application:
    middlewares = [errors_middleware_for(_viewer_error)]
    if token is not None:  # inside the errors middleware, so a refusal is answered in the API's shape
        middlewares.append(_token_middleware(token))
    app = web.Application(middlewares=middlewares)
    app[_INDEX] = index
    app[_TEXT] = text or TokenText()
    app.router.add_get("/", _page)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/api/run", _run)
    app.router.add_get("/api/rollouts", _rollouts)
    app.router.add_get("/api/rollouts/{key}", _rollout)
    app.router.add_get("/api/events", _events)
    app.cleanup_ctx.append(_follower(poll_s))
    return app


def _token_middleware(token: str):
    expected = token.encode()

    @web.middleware
    async def check(request: web.Request, handler):
        presented = request.query.get("token") or request.cookies.get(_COOKIE) or ""
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            presented = header[len("Bearer "):]
        if not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), expected):
            raise Unauthorized("the viewer wants its token: open it with ?token=...")
        response = await handler(request)
        if "token" in request.query:
            response.set_cookie(_COOKIE, token, httponly=True, samesite="Strict")
        return response

    return check


def _follower(poll_s: float):
    async def follow(app: web.Application):
        changed = app[_CHANGED] = asyncio.Condition()
        index = app[_INDEX]

        async def loop() -> None:
            while True:
                await asyncio.sleep(poll_s)
                if await asyncio.to_thread(index.refresh):
                    async with changed:
                        changed.notify_all()

        task = asyncio.create_task(loop(), name="viewer-follow")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return follow


async def _page(request: web.Request) -> web.Response:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def _run(request: web.Request) -> web.Response:
    return json_response(await asyncio.to_thread(run_summary, request.app[_INDEX]))


async def _rollouts(request: web.Request) -> web.Response:
    query = RolloutQuery.from_params(request.query)
    return json_response(await asyncio.to_thread(page, request.app[_INDEX], query))


async def _rollout(request: web.Request) -> web.Response:
    index = request.app[_INDEX]
    key = request.match_info["key"]
    row = index.find(key)
    if row is None:
        raise NotFound(f"no rollout {key!r} in this run")

    def build() -> dict:
        return {**rollout_detail(index.read_record(row), request.app[_TEXT]), "key": row.key}

    return json_response(await asyncio.to_thread(build))


def _event(index: RecordIndex) -> bytes:
    state = {"version": index.version, "rollouts": len(index.rows), "steps": len(index.steps)}
    return b"data: " + orjson.dumps(state) + b"\n\n"


async def _events(request: web.Request) -> web.StreamResponse:
    index, changed = request.app[_INDEX], request.app[_CHANGED]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(_event(index))
    seen = index.version
    with contextlib.suppress(ConnectionResetError):
        while True:
            async with changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait_for(lambda: index.version != seen), _HEARTBEAT_S)
            if index.version != seen:
                seen = index.version
                await response.write(_event(index))
            else:
                await response.write(b": heartbeat\n\n")
    return response
