"""Start each server of bench_gate.py as its own process, and open rollouts on it over HTTP.

    with start_targets({"gate", "verifiers"}, model=..., logs=..., peers_python=..., litellm_python=...) as started:
        upstream_url, targets = started          # targets[0] is `direct`, the fake upstream itself
        endpoint = await targets[1].open(http)   # a fresh rollout: its chat-completions URL and headers

Every server script prints one JSON line on stdout once it listens (its URL, and what a client needs to open a
rollout) and stops on SIGTERM; its stderr goes to `<logs>/<name>.log`. A `Target` is the client side: it opens a
rollout (an `Endpoint`: the chat-completions URL and the headers an agent would send) and closes it.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp

__all__ = [
    "DirectTarget", "Endpoint", "InterceptorTarget", "Process", "Target", "VerifiersTarget", "start_process",
    "start_sharded_gates", "start_targets",
]

_READY_TIMEOUT_S = 120.0  # loading a tokenizer or importing verifiers takes seconds; far more on a busy machine
_STOP_TIMEOUT_S = 10.0
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Process:
    name: str
    pid: int
    ready: dict


@contextlib.contextmanager
def start_process(name: str, argv: list[str], logs: Path) -> Iterator[Process]:
    """Run `argv`, wait for its ready line, yield it, and stop it (SIGTERM, then SIGKILL) on exit."""
    with (logs / f"{name}.log").open("wb") as log:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        try:
            yield Process(name=name, pid=child.pid, ready=_read_ready(name, child, logs))
        finally:
            child.terminate()
            try:
                child.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # it did not shut down in time: end it (our own child, by its handle)
                child.kill()
                child.wait()


def _read_ready(name: str, child: subprocess.Popen, logs: Path) -> dict:
    assert child.stdout is not None
    readable, _, _ = select.select([child.stdout], [], [], _READY_TIMEOUT_S)
    line = child.stdout.readline() if readable else b""  # the whole line, or EOF when the child died
    if not line:
        tail = (logs / f"{name}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{name} did not start (exit code {child.poll()}):\n{tail}")
    return json.loads(line)


@dataclass(frozen=True)
class Endpoint:
    """One rollout as an agent sees it: where to post chat completions, with which headers."""

    id: str
    chat_url: str
    headers: dict[str, str] = field(default_factory=dict)


class Target(Protocol):
    name: str

    async def open(self, http: aiohttp.ClientSession) -> Endpoint: ...

    async def close(self, http: aiohttp.ClientSession, endpoint: Endpoint) -> None: ...


_JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class DirectTarget:
    """A server without rollouts (the fake upstream itself, LiteLLM): every rollout posts to the same endpoint."""

    name: str
    url: str
    api_key: str | None = None

    async def open(self, http: aiohttp.ClientSession) -> Endpoint:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return Endpoint(id=self.name, chat_url=self.url + "/v1/chat/completions", headers={**_JSON, **auth})

    async def close(self, http: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        return None


@dataclass(frozen=True)
class InterceptorTarget:
    """Interceptor's server, either mode: rollouts through its admin API (interceptor/admin.py)."""

    name: str
    url: str
    admin_token: str

    async def open(self, http: aiohttp.ClientSession) -> Endpoint:
        async with http.post(self.url + "/rollouts", json={}, headers=self._admin()) as resp:
            body = await _json_or_raise(resp, self.name)
        return Endpoint(id=body["id"], chat_url=body["base_url"] + "/chat/completions",
                        headers={**_JSON, "Authorization": f"Bearer {body['secret']}"})

    async def close(self, http: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        async with http.post(f"{self.url}/rollouts/{endpoint.id}/finish", json={"status": "ok"},
                             headers=self._admin()) as resp:
            await _read_or_raise(resp, self.name)

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}


@dataclass(frozen=True)
class VerifiersTarget:
    """verifiers' interception server: rollouts through bench/peers/verifiers_server.py's admin app."""

    name: str
    admin_url: str

    async def open(self, http: aiohttp.ClientSession) -> Endpoint:
        async with http.post(self.admin_url + "/rollouts") as resp:
            body = await _json_or_raise(resp, self.name)
        return Endpoint(id=body["id"], chat_url=body["base_url"] + "/chat/completions",
                        headers={**_JSON, "Authorization": f"Bearer {body['secret']}"})

    async def close(self, http: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        async with http.post(f"{self.admin_url}/rollouts/{endpoint.id}/finish") as resp:
            await _read_or_raise(resp, self.name)


async def _read_or_raise(resp: aiohttp.ClientResponse, name: str) -> bytes:
    """The answer's body, unparsed: a finish answers with the record (400 KB after a 32k-token turn, 20 ms of
    json.loads on this process's loop, which times the other rollouts' turns)."""
    raw = await resp.read()
    if resp.status >= 400:
        raise RuntimeError(f"{name} answered {resp.status}: {raw[:500]!r}")
    return raw


async def _json_or_raise(resp: aiohttp.ClientResponse, name: str) -> dict:
    return json.loads(await _read_or_raise(resp, name))


@contextlib.contextmanager
def start_targets(wanted: set[str], *, model: Path, logs: Path, peers_python: Path,
                  litellm_python: Path) -> Iterator[tuple[str, list[Target]]]:
    """Start the fake upstream and the `wanted` proxies (gate, black_box, verifiers, litellm); yield the upstream's
    URL and the targets, `direct` first. Interceptor runs on this interpreter, the peers on their own venvs'."""
    with contextlib.ExitStack() as stack:
        def start(name: str, argv: list[str]) -> dict:
            return stack.enter_context(start_process(name, argv, logs)).ready

        python = sys.executable
        upstream = start("upstream", [python, str(_HERE / "fake_upstream.py"), "--model", str(model)])["url"]
        targets: list[Target] = [DirectTarget("direct", upstream)]
        server = [python, str(_HERE / "interceptor_server.py"), "--upstream", upstream]
        if "gate" in wanted:
            ready = start("gate", [*server, "--mode", "interception_gate", "--model", str(model),
                                   "--record", str(logs / "rollouts.jsonl")])
            targets.append(InterceptorTarget("gate", ready["url"], ready["admin_token"]))
        if "black_box" in wanted:
            ready = start("black_box", [*server, "--mode", "black_box"])
            targets.append(InterceptorTarget("black_box", ready["url"], ready["admin_token"]))
        if "verifiers" in wanted:
            if not peers_python.exists():
                raise SystemExit(f"{peers_python} is missing: run scripts/setup-bench.sh (or leave out verifiers)")
            ready = start("verifiers", [str(peers_python), str(_HERE / "verifiers_server.py"), "--upstream", upstream])
            targets.append(VerifiersTarget("verifiers", ready["url"]))
        if "litellm" in wanted:
            if not litellm_python.exists():
                raise SystemExit(f"{litellm_python} is missing: run scripts/setup-bench.sh (or leave out litellm)")
            ready = start("litellm", [str(litellm_python), str(_HERE / "litellm_server.py"), "--upstream", upstream])
            targets.append(DirectTarget("litellm", ready["url"], ready["api_key"]))  # one endpoint, no rollouts
        yield upstream, targets


def start_sharded_gates(stack: contextlib.ExitStack, upstream: str, model: Path, logs: Path,
                        counts: Sequence[int]) -> list[Target]:
    """The gate as N worker processes behind its admin front (`gate_wN`), one target per N above 1."""
    targets: list[Target] = []
    for count in (n for n in counts if n > 1):
        name = f"gate_w{count}"
        argv = [sys.executable, str(_HERE / "interceptor_server.py"), "--upstream", upstream, "--mode",
                "interception_gate", "--model", str(model), "--record", str(logs / f"rollouts-{name}.jsonl"),
                "--workers", str(count)]
        ready = stack.enter_context(start_process(name, argv, logs)).ready
        targets.append(InterceptorTarget(name, ready["url"], ready["admin_token"]))
    return targets
