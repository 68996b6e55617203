"""The recorded corpus (record.py's files) as the replay reads it: sessions of requests, each with what a replay
needs to send it, answer it and time it.

    sessions = load_corpus(Path("bench/replay/corpus"))
    describe(sessions)            # sessions, requests, context percentiles, tool-output sizes (the peer's terms)

A request's `key` is what the fake servers find its recorded answer by (`request_key`: the path, how many
messages or input items it carries and digests of the first and the last: relayed by black_box, a body is not
the same bytes). What a realistic policy server would take for it is `ModelTiming`'s: prefill of the tokens new
since the session's previous turn, decode of the reply.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import orjson

__all__ = ["ModelTiming", "Request", "Session", "describe", "load_corpus", "request_key"]

_USAGE = re.compile(rb'"(prompt_tokens|input_tokens|completion_tokens|output_tokens)":\s*(\d+)')
# the ids a reply gives its tool calls, in the order they appear (chat and Messages: "id", Responses: "call_id")
CALL_IDS = re.compile(rb'"(?:id|call_id)":"((?:call|toolu)_[0-9A-Za-z]+)"')


@dataclass(frozen=True)
class ModelTiming:
    """A policy server's time per request: `prefill_tps` new prompt tokens and `decode_tps` reply tokens a second
    (one request's share of a busy server). Zero for both: an instant server."""

    prefill_tps: float = 0.0
    decode_tps: float = 0.0

    def seconds(self, new_tokens: int, completion_tokens: int) -> float:
        prefill = new_tokens / self.prefill_tps if self.prefill_tps else 0.0
        decode = completion_tokens / self.decode_tps if self.decode_tps else 0.0
        return prefill + decode


def request_key(method: str, path: str, body: bytes) -> str:
    """What a recorded request is found by, for any copy of its session (see the module's note)."""
    items: object = None
    if body[:1] == b"{":
        parsed = orjson.loads(body)
        items = parsed.get("messages") if "messages" in parsed else parsed.get("input")
    if isinstance(items, list) and items:
        return f"{method} {path} {len(items)} {_digest(items[0])} {_digest(items[-1])}"
    return f"{method} {path} {hashlib.blake2b(body, digest_size=12).hexdigest()}"


def _digest(item: object) -> str:
    return hashlib.blake2b(orjson.dumps(item, option=orjson.OPT_SORT_KEYS), digest_size=12).hexdigest()


@dataclass
class Request:
    index: int
    at: float  # seconds from the session's start, as recorded
    done: float  # when its answer had gone back
    method: str
    path: str  # under /v1
    headers: dict[str, str]
    body: bytes
    status: int
    response: bytes
    key: str
    prompt_tokens: int
    completion_tokens: int
    new_tokens: int = 0  # prompt tokens beyond the session's previous turn (what a prefix cache leaves to prefill)
    after: int | None = None  # the request whose answer it followed (the latest one done before it began)
    think_s: float = 0.0  # the agent's time between that answer and this request (its tools, its own work)
    call_ids: list[bytes] = field(default_factory=list)  # the tool-call ids its answer gave, in order
    pieces: list[bytes] = field(default_factory=list)  # the body cut around every tool-call id

    def render(self, swaps: dict[bytes, bytes]) -> bytes:
        """The body with the tool-call ids a target gave in place of the recorded ones."""
        return b"".join([swaps.get(piece, piece) for piece in self.pieces])

    @property
    def stream(self) -> bool:
        return self.response.startswith((b"data:", b"event:", b":"))


@dataclass
class Session:
    name: str  # <agent>-<package>
    agent: str
    session: str  # "S-...": its name in the instruction
    requests: list[Request]
    kinds: list[str]  # the recorded rollout's chain kinds
    window: int  # the context window the gate had (and the agent was told)
    completions: dict[str, dict]  # policy.prompt_key -> {"ids", "logprobs"}: the policy's replies, in order


_ID = re.compile(rb"(?:call|toolu)_[0-9A-Za-z]+")  # a tool-call id wherever it stands in a body


def _pieces(body: bytes, cut: re.Pattern = _ID) -> list[bytes]:
    pieces, at = [], 0
    for match in cut.finditer(body):
        pieces += [body[at:match.start()], match.group(0)]
        at = match.end()
    pieces.append(body[at:])
    return pieces


def _usage(response: bytes) -> tuple[int, int]:
    found = {name: int(value) for name, value in _USAGE.findall(response)}
    prompt = found.get(b"prompt_tokens", found.get(b"input_tokens", 0))
    completion = found.get(b"completion_tokens", found.get(b"output_tokens", 0))
    return prompt, completion


def load_session(path: Path) -> Session:
    data = orjson.loads(gzip.decompress(path.read_bytes()))
    requests = []
    for index, r in enumerate(data["requests"]):
        body, response = r["body"].encode(), base64.b64decode(r["response"])
        prompt, completion = _usage(response)
        requests.append(Request(index=index, at=r["at"], done=r["done"] or r["at"], method=r["method"],
                                path=r["path"], headers=r["headers"], body=body, status=r["status"] or 0,
                                response=response, key=request_key(r["method"], r["path"], body),
                                prompt_tokens=prompt, completion_tokens=completion,
                                call_ids=CALL_IDS.findall(response)))
    previous = 0
    for request in requests:
        request.pieces = _pieces(request.body)
        before = [r for r in requests if r.done <= request.at]
        if before:
            latest = max(before, key=lambda r: r.done)
            request.after, request.think_s = latest.index, max(0.0, request.at - latest.done)
        if request.prompt_tokens:
            request.new_tokens = max(0, request.prompt_tokens - previous) if request.prompt_tokens > previous else \
                request.prompt_tokens  # a shorter prompt (a compaction, a side call) is a new prefix
            previous = request.prompt_tokens
    return Session(name=path.name.removesuffix(".json.gz"), agent=data["agent"], session=data["session"],
                   requests=requests, kinds=data["record"]["kinds"], window=int(data["window"]),
                   completions=data["completions"])


def load_corpus(folder: Path) -> list[Session]:
    paths = sorted(folder.glob("*.json.gz"))
    if not paths:
        raise SystemExit(f"no sessions in {folder}: record them first (python -m bench.replay.record)")
    return [load_session(p) for p in paths]


def _percentiles(values: list[int]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p10": pick(0.1), "p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1]}


def _tool_outputs(session: Session) -> list[int]:
    """The size (characters) of each tool output the agent sent back, once (the request that first carried it)."""
    sizes = []
    for request in session.requests:
        if request.body[:1] != b"{":
            continue
        body = orjson.loads(request.body)
        items = body.get("messages") or body.get("input") or []
        last = items[-1] if items else {}
        if last.get("role") == "tool":
            sizes.append(len(str(last.get("content", ""))))
        elif last.get("type") == "function_call_output":
            sizes.append(len(str(last.get("output", ""))))
        elif last.get("role") == "user" and isinstance(last.get("content"), list):
            sizes += [len(str(b.get("content", ""))) for b in last["content"] if b.get("type") == "tool_result"]
    return sizes


def describe(sessions: list[Session]) -> dict:
    """The corpus in the terms a peer publishes: sessions, requests, context and tool-output percentiles."""
    contexts = [r.prompt_tokens for s in sessions for r in s.requests if r.prompt_tokens]
    return {
        "sessions": len(sessions),
        "agents": sorted({s.agent for s in sessions}),
        "requests": sum(len(s.requests) for s in sessions),
        "requests_per_session": _percentiles([len(s.requests) for s in sessions]),
        "context_tokens": _percentiles(contexts),
        "session_peak_tokens": _percentiles([max((r.prompt_tokens for r in s.requests), default=0) for s in sessions]),
        "body_bytes": _percentiles([len(r.body) for s in sessions for r in s.requests]),
        "tool_output_chars": _percentiles([n for s in sessions for n in _tool_outputs(s)]),
        "think_s": {k: round(v, 3) for k, v in _percentiles(
            [r.think_s for s in sessions for r in s.requests if r.after is not None]).items()},
        "compactions": sum(k == "compaction" for s in sessions for k in s.kinds),
        "subagents": sum(k == "subagent" for s in sessions for k in s.kinds),
        "mean_completion_tokens": round(statistics.mean(
            [r.completion_tokens for s in sessions for r in s.requests if r.completion_tokens] or [0]), 1),
    }
