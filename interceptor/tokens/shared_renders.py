"""Full renders (a first turn, a fork) shared by every rollout of the server.

The G rollouts of a GRPO group start from the same task, so their first requests are the same conversation: one
render and one tokenization serve them all. A render in progress is awaited by the requests that arrive meanwhile
(never done twice), and a large one runs in a worker thread, where its tokenization (one batch call over chunks,
`Renderer.encode`) releases the GIL, so the other rollouts go on.

The key is the digest of the normalised messages as JSON (orjson, in C) and the tool list's key (`digests.py`: two
conversations share ids by accident with a chance of 2^-128). A kept render holds its ids as the JSON the upstream
body and the record are made of (4.5-4.6 bytes per id with Qwen's vocabulary, measured on the four agents'
captured first requests: near the 4 of an array) and 32 bytes of key; a request that shares it shares those
bytes, nothing is copied. Kept renders are bounded by their total token count.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import orjson

from interceptor.digests import digest
from interceptor.tokens.ids_json import IdsJson
from interceptor.tokens.rendering import Renderer

__all__ = ["SharedRenders"]


class SharedRenders:
    def __init__(self, renderer: Renderer, *, max_tokens: int = 4_000_000) -> None:
        self._renderer = renderer
        self._max_tokens = max_tokens
        self._kept: OrderedDict[bytes, IdsJson] = OrderedDict()
        self._kept_tokens = 0
        self._pending: dict[bytes, asyncio.Future[IdsJson]] = {}
        self.renders = 0  # full renders actually done (the rest were shared)

    async def render_full(self, messages: list[dict], tools: list[dict] | None, tools_key: bytes, *,
                          off_loop: bool) -> IdsJson:
        """The ids of `messages` rendered with `tools` and a generation prompt, as JSON (immutable: shared by
        every request that gets them). `off_loop`: a large request, whose every step over its whole length (the
        key's JSON, the render, the ids' JSON) runs in a worker thread."""
        key = await asyncio.to_thread(_key, messages, tools_key) if off_loop else _key(messages, tools_key)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[IdsJson] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._pending[key] = future
        try:
            self.renders += 1
            render = self._renderer.render_full_json
            ids = await asyncio.to_thread(render, messages, tools) if off_loop else render(messages, tools)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
            else:
                future.cancel()
            raise
        finally:
            del self._pending[key]
        future.set_result(ids)
        self._keep(key, ids)
        return ids

    def _keep(self, key: bytes, ids: IdsJson) -> None:
        if ids.count > self._max_tokens:
            return
        self._kept[key] = ids
        self._kept_tokens += ids.count
        while self._kept_tokens > self._max_tokens:
            _, dropped = self._kept.popitem(last=False)
            self._kept_tokens -= dropped.count


def _key(messages: list[dict], tools_key: bytes) -> bytes:
    return digest(orjson.dumps(messages)) + tools_key


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # a failed render that no other request waited for is not "never retrieved"
