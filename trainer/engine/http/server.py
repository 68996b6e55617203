"""The engine's HTTP face: the part of vLLM's OpenAI server (with `VLLM_SERVER_DEV_MODE=1`) this project uses.

    GET  /health                 200, empty body
    GET  /v1/models              the served model (id, root, max_model_len, ...)
    POST /v1/completions         see `completions.py`
    POST /v1/chat/completions    see `chat.py`
    POST /pause?mode=abort|wait|keep   {"status": "paused"}
    POST /resume                 {"status": "resumed"}
    GET  /is_paused              {"is_paused": bool}
    POST /collective_rpc         {"method": "reload_weights", "kwargs": {"weights_path": DIR}} -> {"results": [null]}

Handlers parse, act and respond; every error is an `EngineError` (or the chat parser's `ApiError`) turned into a
response once, by the middleware. Generation runs on the worker thread, so `/health` answers during long work.
"""

from __future__ import annotations

import logging
import time
import uuid

import orjson
from aiohttp import web

from interceptor.errors import ApiError
from interceptor.wire.protocol import parse_json_body

from trainer.engine.core import EngineCore
from trainer.engine.errors import EngineError, InvalidRequest, error_response
from trainer.engine.http.chat import handle_chat_completions
from trainer.engine.http.checks import check_context_length, check_model, check_prompt_ids
from trainer.engine.http.completions import completion_response, parse_completion_request
from trainer.engine.http.keys import CORE, STARTED_AT, TEXTS
from trainer.engine.textcodec import TokenTexts

__all__ = ["EngineServer", "build_app"]

log = logging.getLogger(__name__)

# How long shutdown lets in-flight requests finish before cancelling them (which aborts their generations).
SHUTDOWN_GRACE_S = 2.0
_PAUSE_MODES = ("abort", "wait", "keep")


def build_app(core: EngineCore) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024**2)
    app[CORE] = core
    app[TEXTS] = TokenTexts(core.tokenizer)
    app[STARTED_AT] = int(time.time())
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/server_info", _server_info)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", handle_chat_completions)
    app.router.add_post("/pause", _pause)
    app.router.add_post("/resume", _resume)
    app.router.add_get("/is_paused", _is_paused)
    app.router.add_post("/collective_rpc", _collective_rpc)
    return app


class EngineServer:
    """`async with EngineServer(core, host=..., port=0) as server:` serves until the block ends."""

    def __init__(self, core: EngineCore, *, host: str, port: int) -> None:
        self._core = core
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port = port

    async def __aenter__(self) -> EngineServer:
        # handler_cancellation: a client that hangs up cancels its handler, which aborts its generation (as vLLM).
        runner = web.AppRunner(
            build_app(self._core), access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S, handler_cancellation=True
        )
        await runner.setup()
        self._runner = runner
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self._host in ("0.0.0.0", "") else self._host
        return f"http://{host}:{self.port}"


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (EngineError, ApiError) as exc:
        return error_response(exc)
    except web.HTTPException:  # aiohttp's own answers (unknown route, wrong method)
        raise
    except Exception as exc:  # top-level capture: a bug still answers in vLLM's error shape, and is logged
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return error_response(EngineError(f"internal error: {exc!r}"))


def _json(obj: object) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _server_info(request: web.Request) -> web.Response:
    """The part of vLLM's `/server_info?config_format=json` (a dev-mode endpoint) that clients read: the model's
    dtype (TRL's `VLLMClient.get_dtype`, `trainer.rl.precision`) and the device."""
    config = request.app[CORE].config
    return _json({"vllm_config": {"model_config": {"model": str(config.model), "dtype": f"torch.{config.dtype}",
                                                   "max_model_len": request.app[CORE].max_model_len},
                                  "device_config": {"device": config.device}}})


async def _models(request: web.Request) -> web.Response:
    core = request.app[CORE]
    created = request.app[STARTED_AT]
    card = {
        "id": core.config.model_name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": str(core.config.model),
        "parent": None,
        "max_model_len": core.max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return _json({"object": "list", "data": [card]})


async def _completions(request: web.Request) -> web.Response:
    core = request.app[CORE]
    policy = core.policy
    body = parse_json_body(await request.read())
    completion = parse_completion_request(body, max_logprobs=core.config.max_logprobs, vocab_size=policy.vocab_size)
    check_model(completion.model, core.config.model_name)
    if isinstance(completion.prompt, str):
        prompt_ids = policy.tokenizer.encode(completion.prompt, add_special_tokens=True)
    else:
        prompt_ids = list(completion.prompt)
    check_prompt_ids(prompt_ids, policy.vocab_size)
    max_tokens = check_context_length(len(prompt_ids), completion.max_tokens, core.max_model_len)
    result = await core.generate(prompt_ids, completion.sampling_params(policy.default_sampling, max_tokens=max_tokens))
    texts = request.app[TEXTS]
    return _json(completion_response(result, completion, model=core.config.model_name, texts=texts))


async def _pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    if request.query.get("wait_for_inflight_requests", "").lower() == "true":  # vLLM's deprecated spelling
        mode = "wait"
    if mode not in _PAUSE_MODES:
        raise InvalidRequest(f"mode must be one of {', '.join(_PAUSE_MODES)}; got {mode!r}", param="mode")
    await request.app[CORE].pause(mode)
    return _json({"status": "paused"})


async def _resume(request: web.Request) -> web.Response:
    await request.app[CORE].resume()
    return _json({"status": "resumed"})


async def _is_paused(request: web.Request) -> web.Response:
    return _json({"is_paused": request.app[CORE].is_paused})


async def _collective_rpc(request: web.Request) -> web.Response:
    core = request.app[CORE]
    body = parse_json_body(await request.read())
    method = body.get("method")
    if method is None:
        raise InvalidRequest("Missing 'method' in request body", param="method")
    if method != "reload_weights":
        raise InvalidRequest(
            f"collective_rpc method {method!r} is not supported by the local engine (only 'reload_weights')",
            param="method",
        )
    kwargs = body.get("kwargs") or {}
    path = kwargs.get("weights_path", str(core.config.model)) if isinstance(kwargs, dict) else None
    if not isinstance(path, str):
        raise InvalidRequest("kwargs.weights_path must be a directory path", param="kwargs")
    try:
        await core.reload_weights(path)
    except ValueError as exc:  # a missing directory, an unknown weight name, a shape mismatch, a corrupt file
        raise InvalidRequest(f"reload_weights failed: {exc}", param="kwargs") from exc
    return _json({"results": [None]})
