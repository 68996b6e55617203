"""A blocking HTTP/1.1 client that sends fuzzed requests byte for byte, and the verdict on each answer.

The contract checked (DESIGN.md, invariant 7): no answer is a 5xx (the fake upstream never fails unless told),
every 4xx is in the error shape of the route's dialect, OpenAI's `{"error": {"message", "type", "param", "code"}}`
or (Messages) Anthropic's `{"type": "error", "error": {"type", "message"}}` (except the plain-text 400s aiohttp's
HTTP parser sends before the app sees a request), and a 200 stream ends with `[DONE]`.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass

import orjson

from tests.interceptor.fuzz_inputs import Case, Step
from tests.interceptor.fuzz_values import AUTHORIZATIONS, Credentials

__all__ = ["HttpClient", "Outcome", "Reply", "is_anthropic_error", "is_openai_error", "run_case"]

SSE_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    cut_off: bool  # the connection closed before the body was complete


class HttpClient:
    """Blocking HTTP/1.1 to 127.0.0.1 that sends header bytes as given (aiohttp's client only sends text).
    One keep-alive connection, reopened when the server closed it."""

    def __init__(self, port: int, *, timeout_s: float = 60.0) -> None:
        self._port = port
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, authorization: bytes | None, body: bytes | None,
                headers: tuple[tuple[str, bytes], ...] = ()) -> Reply:
        reused = self._conn is not None
        try:
            response = self._send(method, path, authorization, body, headers)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.close()
            if not reused:
                raise
            response = self._send(method, path, authorization, body, headers)  # the server closed an idle connection
        try:
            data, cut_off = response.read(), False
        except http.client.IncompleteRead as exc:
            data, cut_off = exc.partial, True
        if cut_off or response.will_close:
            self.close()
        return Reply(response.status, data, cut_off)

    def _send(self, method: str, path: str, authorization: bytes | None, body: bytes | None,
              headers: tuple[tuple[str, bytes], ...]):
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=self._timeout_s)
        conn = self._conn
        conn.putrequest(method, path, skip_accept_encoding=True)
        if authorization is not None:
            conn.putheader("Authorization", authorization)
        if body is not None:
            if not any(name.lower() == "content-type" for name, _ in headers):
                conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders(body)
        return conn.getresponse()


@dataclass(frozen=True, slots=True)
class Outcome:
    step: Step
    path: str
    status: int
    body: bytes
    problem: str | None  # why this answer breaks the contract; None when it keeps it


def run_case(client: HttpClient, case: Case, credentials: Credentials) -> list[Outcome]:
    outcomes = []
    for step in case.steps:
        path = step.path.replace("{rid}", credentials.rollout_id)
        reply = client.request(step.method, path, AUTHORIZATIONS[step.auth](credentials), step.body, step.headers)
        outcomes.append(Outcome(step, path, reply.status, reply.body, _problem(step, reply)))
        if step.route == "admin_open":
            if reply.status != 201:
                break
            opened = orjson.loads(reply.body)
            credentials = Credentials(opened["id"], opened["secret"], opened["tools_secret"], credentials.admin_token)
    return outcomes


def _problem(step: Step, reply: Reply) -> str | None:
    if reply.cut_off:
        return f"{reply.status} cut off"
    if reply.status >= 500:
        return str(reply.status)
    if reply.status >= 400 and not step.http_layer and step.shape == "anthropic":
        return None if is_anthropic_error(reply.body) else f"{reply.status} not Anthropic-shaped"
    if reply.status >= 400 and not step.http_layer and not is_openai_error(reply.body):
        return f"{reply.status} not OpenAI-shaped"
    if reply.status == 200 and step.stream and not reply.body.endswith(SSE_DONE):
        return "stream without [DONE]"
    return None


def is_anthropic_error(body: bytes) -> bool:
    """Anthropic's `{"type": "error", "error": {"type", "message"}}` (the Messages dialect's errors)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return (parsed.get("type") == "error" and isinstance(error, dict) and isinstance(error.get("type"), str)
            and isinstance(error.get("message"), str))


def is_openai_error(body: bytes) -> bool:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
        and {"param", "code"} <= error.keys()
    )
