"""The client for the policy server (vLLM or the local engine) and, in black_box mode, any OpenAI-style API.

The JSON calls (a generation per turn, the model list) go through a lean keep-alive HTTP/1.1 pool when the
upstream is plain http (`http1.py`: aiohttp's client was the largest single cost of a busy gate), else through the
pooled aiohttp session, which also carries black_box relays. One retry policy (`_retrying`, a plain loop: a
retrying object per call cost more than the call's own parsing) covers both: connection errors, resets before or in
the middle of a body (aiohttp's payload errors, the pool's `HttpError`), an aborted generation and the statuses in
`RETRYABLE_STATUSES` are retried with jittered exponential backoff (full jitter), within an `AttemptBudget`: the
total number of upstream calls one turn may cost, shared by the agent's own retries of that turn (so an SDK that
retries 3 times does not make 3 x 4 calls). What still fails is converted once, here, into the interceptor's errors:
unreachable or failing -> 503, timed out -> 504, a reply that breaks the contract -> 502.

Generation goes through `/v1/completions` with token ids in and token ids out, never streaming (streamed token ids
are lossy around tool calls). The reply is parsed into a `Generation` by `parse_generation`, which checks every
field the samples depend on and that the policy could have sampled it (at least one id, no more than `max_tokens`
and the context allow, ids in the vocabulary, one finite logprob at most 0 per id): a missing logprob is an error,
never a zero. A request the HTTP client will not make fails upstream too (502). URLs in messages have their
credentials removed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from interceptor.config import UpstreamConfig
from interceptor.errors import ApiError, ContextLengthExceeded, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from interceptor.store.records import Generation
from interceptor.tokens.ids_json import PromptJson
from interceptor.transport.http1 import Http1Pool, HttpError, lean_client_serves

__all__ = ["AttemptBudget", "RETRYABLE_STATUSES", "UpstreamClient", "parse_generation", "redact_url"]

log = logging.getLogger("interceptor.transport.upstream")

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
T = TypeVar("T")
# How far above 0 a logprob may be and still be the policy's. log_softmax is <= 0 in exact arithmetic and vLLM
# sends a certain token's as 0.0; no vLLM reply above 0 has been seen, but a GPU kernel's approximate exp and log
# may leave a near-certain token a few ulps over. 1e-4 (a probability of 1.0001) moves no importance ratio, and a
# server that breaks the contract sends far more.
_LOGPROB_SLACK = 1e-4
_ERROR_TEXT_KEPT = 500  # characters of an upstream error body quoted in our own error message


@dataclass(eq=False, slots=True)
class AttemptBudget:
    """Upstream calls one turn may still make. Shared by every try of the same turn."""

    total: int
    used: int = 0

    @property
    def spent(self) -> bool:
        return self.used >= self.total


class _Retryable(Exception):
    """A failure worth another attempt (a status in RETRYABLE_STATUSES, an aborted generation)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


Sampling = dict  # the sampling fields of a /v1/completions request (temperature, top_p, top_k, seed, max_tokens)


def redact_url(url: str) -> str:
    """The URL without `user:password@`, for messages that reach agents, logs and records."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class UpstreamClient:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._pool: Http1Pool | None = None
        self._where = redact_url(config.root)
        self._json_headers = self._headers()

    async def __aenter__(self) -> UpstreamClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.config.max_connections),
            # No cookie jar: a cookie the upstream sets answering one rollout must not go out with another's
            # request (and the jar's filtering was 1% of a busy gate's time).
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(
                total=self.config.request_timeout_s, sock_connect=self.config.connect_timeout_s
            ),
        )
        if self.config.lean_client and lean_client_serves(self.config.root):  # the JSON calls take the lean path
            self._pool = Http1Pool(self.config.root, limit=self.config.max_connections,
                                   connect_timeout_s=self.config.connect_timeout_s)
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient used outside `async with`")
        return self._session

    def new_budget(self) -> AttemptBudget:
        return AttemptBudget(total=self.config.attempts)

    def _headers(self, extra: Mapping[str, str] | None = None, *, key_header: str | None = None) -> dict[str, str]:
        """JSON, `extra` (a relayed dialect's own headers) and the server's key, never the agent's: as `key_header`
        when given (Anthropic's `x-api-key`), else as a Bearer token."""
        headers = {"Content-Type": "application/json", **(extra or {})}
        if self.config.api_key:
            if key_header:
                headers[key_header] = self.config.api_key
            else:
                headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    # ------------------------------------------------------------------------------- the one retry policy

    async def _fetch(self, method: str, path: str, data: bytes | None, *, budget: AttemptBudget) -> bytes:
        """The body of a JSON call's answer, tried within `budget`; any 4xx or 5xx left is an error. Plain http
        upstreams (vLLM, the local engine) are called through the lean pool (`http1.py`), others through aiohttp."""
        self._check_budget(budget)
        with self._converted_errors():
            return await self._retrying(budget, functools.partial(self._fetch_once, method, path, data))

    @asynccontextmanager
    async def _send(
        self, method: str, path: str, *, data: bytes | None, budget: AttemptBudget,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send until an answer worth relaying, within `budget`, and yield the response with its body unread
        (black_box): a response whose status is not retryable is the agent's answer and comes back as it is, for
        streaming through (a 429 too: the agent's own back-off applies)."""
        self._check_budget(budget)
        url = self.config.root + path
        with self._converted_errors():
            resp = await self._retrying(budget, functools.partial(self._relay_once, method, url, data, headers))
            try:
                yield resp
            finally:
                resp.release()

    def _check_budget(self, budget: AttemptBudget) -> None:
        if budget.spent:
            raise UpstreamUnavailable(
                f"this turn has used its {budget.total} upstream calls (the agent's retries share them); "
                "the policy server is failing"
            )

    @contextmanager
    def _converted_errors(self) -> Iterator[None]:
        """What still fails after the retries, as the interceptor's errors (503, 504)."""
        try:
            yield
        except _Retryable as exc:
            raise UpstreamUnavailable(f"the policy server at {self._where} kept failing ({exc.message})") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, HttpError) as exc:
            raise UpstreamUnavailable(f"cannot reach the policy server at {self._where}: {_describe(exc)}") from exc
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"the policy server at {self._where} did not answer within {self.config.request_timeout_s}s"
            ) from exc
        except aiohttp.ClientError as exc:  # anything else aiohttp raises: bad URL, too many redirects, ...
            raise UpstreamUnavailable(f"the request to {self._where} failed: {_describe(exc)}") from exc

    async def _retrying(self, budget: AttemptBudget, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()` until it succeeds or fails for good, or the budget is spent; a random wait below a doubling
        bound between tries. Connection errors, resets (before or in the middle of a body) and `_Retryable` are
        tried again; a timeout is not (a generation that slow is not sped up by a second one)."""
        tries = 0
        while True:
            budget.used += 1
            tries += 1
            try:
                return await attempt()
            except (_Retryable, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, HttpError):
                if budget.spent:
                    raise
            except (ApiError, TimeoutError, aiohttp.ClientError):
                raise  # an answer that is an error, or one `_converted_errors` converts
            except Exception as exc:  # the capture point of the request itself: see `_unsendable`
                raise self._unsendable(exc) from exc
            bound = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (tries - 1))
            await asyncio.sleep(random.uniform(0, bound))

    def _unsendable(self, exc: Exception) -> UpstreamError:
        """A request the HTTP client would not make (aiohttp refuses some header and URL combinations with a
        ValueError): never retried, it fails the turn upstream, so the rollout is not rewarded, rather than being a
        500 no one counts. Logged with its traceback: it is a configuration or a defect, not the upstream's mood."""
        log.error("a request to the policy server at %s could not be made", self._where, exc_info=exc)
        return UpstreamError(f"the request to the policy server at {self._where} could not be made: {_describe(exc)}")

    async def _fetch_once(self, method: str, path: str, data: bytes | None) -> bytes:
        if self._pool is not None:
            status, raw = await self._pool.request(method.encode("ascii"), path, data, self._json_headers,
                                                   timeout_s=self.config.request_timeout_s)
        else:
            async with self.session.request(method, self.config.root + path, data=data,
                                            headers=self._json_headers) as resp:
                status, raw = resp.status, await resp.read()  # read here: a reset in the middle is retried
        if status in RETRYABLE_STATUSES:
            raise _Retryable(f"answered {status}: {raw.decode(errors='replace')[:_ERROR_TEXT_KEPT]}")
        if status >= 400:
            raise _client_error(status, raw)
        return raw

    async def _relay_once(self, method: str, url: str, data: bytes | None, headers: dict[str, str] | None
                          ) -> aiohttp.ClientResponse:
        resp = await self.session.request(method, url, data=data, headers=headers or self._json_headers)
        if resp.status in RETRYABLE_STATUSES and resp.status != 429:
            try:
                text = (await resp.read()).decode(errors="replace")
            finally:
                resp.release()
            raise _Retryable(f"answered {resp.status}: {text[:_ERROR_TEXT_KEPT]}")
        return resp

    async def _post_json(self, path: str, payload: dict, *, budget: AttemptBudget, prompt: PromptJson | None = None) -> object:
        """POST `payload` (with `prompt`, when given, as its `prompt`: ids already serialised, joined here once)."""
        data = orjson.dumps(payload)
        if prompt is not None:
            data = prompt.body(b'{"prompt":', b"," + data[1:] if len(data) > 2 else b"}")
        raw = await self._fetch("POST", path, data, budget=budget)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(f"the policy server sent invalid JSON: {exc}") from exc

    # ----------------------------------------------------------------------------------------- calls

    async def models(self) -> list[dict]:
        raw = await self._fetch("GET", "/v1/models", None, budget=self.new_budget())
        try:
            data = orjson.loads(raw)["data"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise UpstreamError(f"{self._where}/v1/models is not a model list: {exc!r}") from exc
        if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
            raise UpstreamError(f"{self._where}/v1/models is not a model list")
        return data

    async def complete(
        self,
        *,
        model: str,
        prompt: PromptJson,
        sampling: Sampling,
        vocab_size: int,
        max_model_len: int,
        top_logprobs: int = 0,
        budget: AttemptBudget | None = None,
    ) -> Generation:
        """Generate after `prompt` (token ids, already serialised as JSON), at most `sampling["max_tokens"]` tokens
        and within the model's context of `max_model_len` (what the reply is checked against)."""
        payload = {
            "model": model,
            "return_token_ids": True,
            "logprobs": top_logprobs,  # 0: the sampled token's logprob only
            **sampling,
        }
        budget = budget or self.new_budget()
        while True:
            started = time.perf_counter()
            body = await self._post_json("/v1/completions", payload, budget=budget, prompt=prompt)
            try:
                return parse_generation(
                    body, model=model, vocab_size=vocab_size, top_logprobs=top_logprobs,
                    seconds=time.perf_counter() - started, max_tokens=sampling.get("max_tokens"),
                    prompt_tokens=prompt.count, max_model_len=max_model_len,
                )
            except _Retryable as exc:  # the generation was aborted (a pause with mode=abort): try again
                if budget.spent:
                    raise UpstreamUnavailable(f"the policy server at {self._where} {exc.message}") from exc

    @asynccontextmanager
    async def relay(
        self,
        path: str,
        body: bytes,
        *,
        budget: AttemptBudget | None = None,
        extra_headers: Mapping[str, str] | None = None,
        key_header: str | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST `body` unchanged to the upstream (black_box) and yield the open response for streaming through.
        Failing statuses are retried; once the upstream has answered otherwise, its answer is the agent's.
        `extra_headers` and `key_header` are a dialect's (Anthropic's version header and `x-api-key`)."""
        headers = self._headers(extra_headers, key_header=key_header)
        async with self._send("POST", path, data=body, budget=budget or self.new_budget(), headers=headers) as resp:
            yield resp


def parse_generation(
    body: object, *, model: str, vocab_size: int, top_logprobs: int, seconds: float, max_tokens: int | None,
    prompt_tokens: int, max_model_len: int,
) -> Generation:
    """The `Generation` in a `/v1/completions` reply to a request for at most `max_tokens` after `prompt_tokens`
    in a context of `max_model_len`, or `UpstreamError` (502) naming what breaks the contract: a reply no policy
    could have sampled (no token, more than was asked for or fits, a logprob above 0) is never recorded."""
    try:
        choice = body["choices"][0]  # type: ignore[index]
        token_ids = choice["token_ids"]
        logprobs = choice["logprobs"]
        token_logprobs = logprobs["token_logprobs"]
        finish_reason = choice["finish_reason"]
    except (KeyError, IndexError, TypeError) as exc:
        raise UpstreamError(
            f"the policy server's answer lacks token_ids or logprobs ({exc!r}); is it vLLM >= 0.10.2?"
        ) from exc
    if finish_reason == "abort":
        raise _Retryable("aborted the generation")
    if finish_reason not in ("stop", "length"):
        raise UpstreamError(f"the policy server returned an unknown finish_reason {str(finish_reason)[:50]!r}")
    finish_reason = "stop" if finish_reason == "stop" else "length"  # the literal, not the reply's copy (kept per turn)
    if not isinstance(token_ids, list) or not isinstance(token_logprobs, list):
        raise UpstreamError("the policy server's token_ids and token_logprobs must be lists")
    sampled = len(token_ids)
    if sampled != len(token_logprobs):
        raise UpstreamError(f"the policy server returned {sampled} token ids but {len(token_logprobs)} logprobs")
    if not sampled:  # vLLM samples at least one token for max_tokens >= 1 (an aborted generation is retried above)
        raise UpstreamError(f"the policy server returned no sampled token (finish_reason {finish_reason!r})")
    if max_tokens is not None and sampled > max_tokens:
        raise UpstreamError(f"the policy server returned {sampled} sampled tokens for max_tokens {max_tokens}")
    if prompt_tokens + sampled > max_model_len:
        raise UpstreamError(
            f"the policy server returned {sampled} sampled tokens after a {prompt_tokens}-token prompt, past the "
            f"model's context of {max_model_len} tokens"
        )
    if not all(type(t) is int for t in token_ids) or (token_ids and not 0 <= min(token_ids) <= max(token_ids) < vocab_size):
        raise UpstreamError(f"the policy server returned token ids that are not in the vocabulary (0..{vocab_size - 1})")
    if not all(type(lp) is float or type(lp) is int for lp in token_logprobs):
        raise UpstreamError("the policy server left a sampled token without a numeric logprob")
    if not all(math.isfinite(lp) for lp in token_logprobs):
        raise UpstreamError("the policy server returned a logprob that is not finite")
    if (highest := max(token_logprobs)) > _LOGPROB_SLACK:
        raise UpstreamError(f"the policy server returned a logprob above 0 ({highest:.6g}): a probability above 1")
    tops = None
    if top_logprobs:
        tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(tops, list) or len(tops) != len(token_ids) or not all(_is_top_entry(t) for t in tops):
            raise UpstreamError("the policy server's top_logprobs do not match its sampled tokens")
    answered_model = body.get("model") if isinstance(body, dict) else None
    return Generation(
        token_ids=token_ids,
        logprobs=[float(lp) for lp in token_logprobs],
        finish_reason=finish_reason,  # one of two literals (checked above): the same objects in every turn
        model=sys.intern(answered_model) if isinstance(answered_model, str) and len(answered_model) < 256 else model,
        seconds=seconds,
        top_logprobs=tops,
    )


def _is_top_entry(entry: object) -> bool:
    return isinstance(entry, dict) and all(
        isinstance(k, str) and (type(v) is float or type(v) is int) and math.isfinite(v) and v <= _LOGPROB_SLACK
        for k, v in entry.items()
    )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_ERROR_TEXT_KEPT]


def _client_error(status: int, raw: bytes) -> Exception:
    text = raw.decode(errors="replace")
    try:
        message = orjson.loads(raw)["error"]["message"]
        if not isinstance(message, str):
            raise TypeError
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = text[:_ERROR_TEXT_KEPT]
    if status == 400 and "context length" in message:
        return ContextLengthExceeded(message)
    return UpstreamError(f"the policy server rejected the request ({status}): {message[:_ERROR_TEXT_KEPT]}")
