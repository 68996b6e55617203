"""The client for the policy server (vLLM or the local engine) and, in black_box mode, any OpenAI-style API.

One pooled aiohttp session. Generation goes through `/v1/completions` with token ids in and token ids out, never
streaming (streamed token ids are lossy around tool calls). Connection errors, 429 and 5xx are retried with
jittered exponential backoff (tenacity); what still fails is converted once, here, into the interceptor's errors:
unreachable -> 503, timed out -> 504, anything else -> 502. A missing logprob is an error, never a zero.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import aiohttp
import orjson
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from .config import UpstreamConfig
from .errors import ContextLengthExceeded, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from .trajectory import Generation

__all__ = ["UpstreamClient", "Sampling"]

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class _RetryableStatus(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"upstream answered {status}: {text[:500]}")
        self.status = status
        self.text = text


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (_RetryableStatus, aiohttp.ClientConnectionError))


Sampling = dict  # the sampling fields of a /v1/completions request (temperature, top_p, top_k, seed, max_tokens)


class UpstreamClient:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> UpstreamClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.config.max_connections),
            timeout=aiohttp.ClientTimeout(
                total=self.config.request_timeout_s, sock_connect=self.config.connect_timeout_s
            ),
            json_serialize=lambda obj: orjson.dumps(obj).decode(),
        )
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient used outside `async with`")
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.config.attempts),
            wait=wait_random_exponential(multiplier=self.config.backoff_initial_s, max=self.config.backoff_max_s),
            retry=retry_if_exception(_retryable),
            reraise=True,
        )

    async def _post_json(self, path: str, payload: dict) -> dict:
        data = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)  # prompt ids may be a numpy array
        url = self.config.root + path
        try:
            async for attempt in self._retrying():
                with attempt:
                    async with self.session.post(url, data=data, headers=self._headers()) as resp:
                        raw = await resp.read()
                        if resp.status in RETRYABLE_STATUSES:
                            raise _RetryableStatus(resp.status, raw.decode(errors="replace"))
                        if resp.status >= 400:
                            raise _client_error(resp.status, raw)
                        return orjson.loads(raw)
        except _RetryableStatus as exc:
            raise UpstreamUnavailable(f"the policy server kept failing: {exc}") from exc
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamUnavailable(f"cannot reach the policy server at {self.config.root}: {exc}") from exc
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise UpstreamTimeout(f"the policy server did not answer within {self.config.request_timeout_s}s") from exc
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(f"the policy server sent invalid JSON: {exc}") from exc
        raise AssertionError("unreachable: tenacity either returns or re-raises")

    async def models(self) -> list[dict]:
        url = self.config.root + "/v1/models"
        try:
            async for attempt in self._retrying():
                with attempt:
                    async with self.session.get(url, headers=self._headers()) as resp:
                        if resp.status in RETRYABLE_STATUSES:
                            raise _RetryableStatus(resp.status, await resp.text())
                        resp.raise_for_status()
                        return (await resp.json(loads=orjson.loads))["data"]
        except (aiohttp.ClientError, _RetryableStatus, KeyError) as exc:
            raise UpstreamUnavailable(f"cannot list the models of {self.config.root}: {exc}") from exc
        raise AssertionError("unreachable")

    async def complete(self, *, model: str, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        payload = {
            "model": model,
            "prompt": prompt_ids,
            "return_token_ids": True,
            "logprobs": 0,  # the sampled token's logprob only
            **sampling,
        }
        started = time.perf_counter()
        body = await self._post_json("/v1/completions", payload)
        seconds = time.perf_counter() - started
        try:
            choice = body["choices"][0]
            token_ids = choice["token_ids"]
            logprobs = choice["logprobs"]["token_logprobs"]
            finish_reason = choice["finish_reason"]
        except (KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(
                f"the policy server's answer lacks token_ids or logprobs ({exc!r}); is it vLLM >= 0.10.2?"
            ) from exc
        if not isinstance(token_ids, list) or not isinstance(logprobs, list) or len(token_ids) != len(logprobs):
            raise UpstreamError("the policy server returned token_ids and logprobs of different lengths")
        if any(lp is None for lp in logprobs):
            raise UpstreamError("the policy server left a sampled token without a logprob")
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish_reason if finish_reason in ("stop", "length") else "stop",
            model=body.get("model", model),
            seconds=seconds,
        )

    @asynccontextmanager
    async def relay(self, path: str, body: bytes) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST `body` unchanged to the upstream (black_box) and yield the open response for streaming through.
        Only connecting is retried: once the upstream has answered, its answer is the agent's."""
        url = self.config.root + path
        try:
            async for attempt in self._retrying():
                with attempt:
                    resp = await self.session.post(url, data=body, headers=self._headers())
                    if resp.status in RETRYABLE_STATUSES and resp.status != 429:
                        text = await resp.text()
                        resp.release()
                        raise _RetryableStatus(resp.status, text)
        except _RetryableStatus as exc:
            raise UpstreamUnavailable(f"the upstream kept failing: {exc}") from exc
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamUnavailable(f"cannot reach the upstream at {self.config.root}: {exc}") from exc
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise UpstreamTimeout("the upstream did not answer in time") from exc
        try:
            yield resp
        finally:
            resp.release()


def _client_error(status: int, raw: bytes) -> Exception:
    text = raw.decode(errors="replace")
    try:
        message = orjson.loads(raw)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = text[:500]
    if status == 400 and "context length" in message:
        return ContextLengthExceeded(message)
    return UpstreamError(f"the policy server rejected the request ({status}): {message}")
