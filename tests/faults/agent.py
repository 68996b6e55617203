"""The agent and the driver, as raw HTTP: a chat call that reports exactly what came back (status, body, SSE
events), and the admin calls a driver makes (`GET /rollouts/{id}`, `POST /rollouts/{id}/finish`)."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import orjson

__all__ = ["ADMIN_TOKEN", "Answer", "chat", "finish", "rollout_status"]

ADMIN_TOKEN = "admin-token-for-fault-tests"


@dataclass(frozen=True)
class Answer:
    """One chat call as the agent saw it."""

    status: int
    content_type: str
    headers: dict[str, str]
    raw: bytes  # what arrived, all of it or up to where the connection broke
    broken: str | None = None  # why the body ended early (the server dropped the connection), if it did

    @property
    def json(self) -> object:
        return orjson.loads(self.raw)

    @property
    def events(self) -> list[bytes]:
        """The SSE events of a stream, in order: comment lines (`: keepalive`) and `data: ...` lines."""
        return [event.strip() for event in self.raw.split(b"\n\n") if event.strip()]

    @property
    def named_events(self) -> list[tuple[str, dict]]:
        """(event name, data) of each `event:` block of a stream (Messages and Responses name their events);
        comment lines (keepalives) are left out."""
        out = []
        for block in self.raw.split(b"\n\n"):
            lines = dict(line.split(b": ", 1) for line in block.strip().split(b"\n") if b": " in line)
            if b"event" in lines:
                out.append((lines[b"event"].decode(), orjson.loads(lines[b"data"])))
        return out

    @property
    def keepalives(self) -> int:
        return sum(1 for event in self.events if event.startswith(b":"))

    @property
    def data(self) -> list[object]:
        """The `data:` payloads of a stream, parsed; `[DONE]` stays the string "[DONE]"."""
        payloads = []
        for event in self.events:
            if event.startswith(b"data:"):
                payload = event[len(b"data:") :].strip()
                try:
                    payloads.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
                except orjson.JSONDecodeError:
                    payloads.append(f"<not JSON: {payload[:100]!r}>")
        return payloads

    @property
    def error(self) -> dict | None:
        """The OpenAI error object: the body of an error status, or a stream's `error` event."""
        if self.content_type.startswith("text/event-stream"):
            errors = [d["error"] for d in self.data if isinstance(d, dict) and "error" in d]
            return errors[0] if errors else None
        body = self.json
        return body.get("error") if isinstance(body, dict) else None

    @property
    def content(self) -> str | None:
        """The assistant's text: the message of a JSON answer, or the stream's content deltas joined."""
        if self.content_type.startswith("text/event-stream"):
            parts = [
                choice["delta"].get("content") or ""
                for d in self.data
                if isinstance(d, dict)
                for choice in d.get("choices") or ()
            ]
            return "".join(parts) if any(parts) else None
        return self.json["choices"][0]["message"]["content"]

    @property
    def finish_reason(self) -> str | None:
        if self.content_type.startswith("text/event-stream"):
            reasons = [
                choice.get("finish_reason")
                for d in self.data
                if isinstance(d, dict)
                for choice in d.get("choices") or ()
                if choice.get("finish_reason")
            ]
            return reasons[-1] if reasons else None
        return self.json["choices"][0]["finish_reason"]


async def chat(
    http: aiohttp.ClientSession,
    base_url: str,
    secret: str,
    *,
    body: dict | None = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    path: str = "/chat/completions",
) -> Answer:
    """POST a chat completion (or, with `path`, another dialect's request); `raw` sends exact bytes (an SDK retry
    resends the same body). A connection that breaks before the status line raises `aiohttp.ClientError`; one that
    breaks in the body is `Answer.broken`."""
    data = raw if raw is not None else orjson.dumps(body)
    sent = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json", **(headers or {})}
    async with http.post(base_url + path, data=data, headers=sent) as resp:
        received, broken = [], None
        try:
            async for chunk in resp.content.iter_any():
                received.append(chunk)
        except aiohttp.ClientError as exc:
            broken = f"{type(exc).__name__}: {exc}"
        return Answer(
            status=resp.status,
            content_type=resp.content_type,
            headers=dict(resp.headers),
            raw=b"".join(received),
            broken=broken,
        )


async def rollout_status(http: aiohttp.ClientSession, server_url: str, rollout_id: str) -> tuple[int, dict | str]:
    """The admin view of a live rollout: (HTTP status, JSON body or text)."""
    async with http.get(f"{server_url}/rollouts/{rollout_id}", headers=_admin()) as resp:
        return resp.status, await _body(resp)


async def finish(
    http: aiohttp.ClientSession, server_url: str, rollout_id: str, body: dict
) -> tuple[int, dict | str]:
    """Finish a rollout as a driver does: (HTTP status, the record as JSON, or the text of an error)."""
    async with http.post(f"{server_url}/rollouts/{rollout_id}/finish", json=body, headers=_admin()) as resp:
        return resp.status, await _body(resp)


async def _body(resp: aiohttp.ClientResponse) -> dict | str:
    text = await resp.text()
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
