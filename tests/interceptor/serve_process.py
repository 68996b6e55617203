"""`interceptor serve` as a child process, for tests that kill it, and an agent-like client that talks to it.

The child binds port 0 and the URL is read back from the line it prints (`... listening on http://...`); its
stderr goes to a file whose tail ends up in the failure message. The admin token reaches it through the
environment only, as in production. Leaving the context kills whatever is still running: a failed test never
leaves a server behind.

`Conversation` drives one rollout the way an agent does: every turn sends the whole history plus one new
message (a tool result after a tool call, a user message after text), and keeps the replies it received.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

__all__ = ["Conversation", "ServeProcess", "serve_process"]

STARTUP_TIMEOUT_S = 60.0  # importing transformers and loading the tokenizer on a busy 2-core machine
EXIT_TIMEOUT_S = 30.0  # a graceful stop waits out in-flight turns (shutdown_grace_s is 5 s) and writes records
_LISTENING = re.compile(rb"listening on (http://\S+)")


@dataclass(eq=False)
class ServeProcess:
    process: asyncio.subprocess.Process
    url: str
    admin_token: str
    stderr_path: Path

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    async def open_rollout(self, session: aiohttp.ClientSession, *, max_tokens: int = 64) -> dict:
        """POST /rollouts: {"id", "base_url", "secret", "tools_secret"}."""
        body = {"sampling": {"max_tokens": max_tokens}}
        async with session.post(f"{self.url}/rollouts", json=body, headers=self.admin_headers) as response:
            assert response.status == 201, await response.text()
            return await response.json()

    async def finish_rollout(self, session: aiohttp.ClientSession, rollout_id: str, *, reward: float) -> dict:
        """POST /rollouts/{id}/finish: the record, on disk before the answer comes."""
        url = f"{self.url}/rollouts/{rollout_id}/finish"
        async with session.post(url, json={"reward": reward}, headers=self.admin_headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def kill(self) -> int:
        """kill -9: no handler runs, nothing is flushed."""
        self.process.kill()
        return await self.wait()

    async def terminate(self) -> int:
        """SIGTERM: a graceful stop; returns the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return await self.wait()

    async def wait(self) -> int:
        async with asyncio.timeout(EXIT_TIMEOUT_S):
            return await self.process.wait()

    def stderr_tail(self, lines: int = 40) -> str:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@asynccontextmanager
async def serve_process(
    *, upstream_url: str, model_dir: Path, record_path: Path, workdir: Path, admin_token: str, workers: int = 1
) -> AsyncIterator[ServeProcess]:
    workdir.mkdir(parents=True, exist_ok=True)
    starts = len(list(workdir.glob("serve-*.stderr")))
    stderr_path = workdir / f"serve-{starts}.stderr"
    env = {**os.environ, "INTERCEPTOR_ADMIN_TOKEN": admin_token}
    argv = [
        sys.executable, "-m", "interceptor.cli", "serve",
        "--upstream", upstream_url,
        "--model", str(model_dir),
        "--record", str(record_path),
        "--host", "127.0.0.1",
        "--port", "0",
        "--admin-token-file", str(workdir / "admin-token"),
        "--workers", str(workers),
    ]  # fmt: skip
    with open(stderr_path, "wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, cwd=Path(__file__).parents[2]
        )
    try:
        url = await _read_url(process, stderr_path)
        yield ServeProcess(process=process, url=url, admin_token=admin_token, stderr_path=stderr_path)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _read_url(process: asyncio.subprocess.Process, stderr_path: Path) -> str:
    assert process.stdout is not None
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            while line := await process.stdout.readline():
                if match := _LISTENING.search(line):
                    return match.group(1).decode()
    except TimeoutError:
        pass
    raise AssertionError(
        f"interceptor serve did not report its URL (exit status {process.returncode}):\n"
        + stderr_path.read_text(errors="replace")[-4000:]
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


@dataclass(eq=False)
class Conversation:
    """One rollout's agent. `replies` holds every assistant message whose 200 arrived, in order."""

    rollout: dict  # the admin API's answer to POST /rollouts
    messages: list[dict] = field(default_factory=list)
    replies: list[dict] = field(default_factory=list)
    waiting: bool = False  # a chat call is out and unanswered

    def __post_init__(self) -> None:
        self.messages = [
            {"role": "system", "content": "You are a terse agent."},
            {"role": "user", "content": f"task for {self.rollout['id']}"},
        ]

    async def turn(self, session: aiohttp.ClientSession) -> dict:
        """One chat call with the whole history; on a 200, the reply and the agent's next message join it."""
        url = f"{self.rollout['base_url']}/chat/completions"
        headers = {"Authorization": f"Bearer {self.rollout['secret']}"}
        body = {"model": "policy", "messages": self.messages, "tools": TOOLS}
        self.waiting = True
        try:
            async with session.post(url, json=body, headers=headers) as response:
                assert response.status == 200, await response.text()
                reply = (await response.json())["choices"][0]["message"]
        finally:
            self.waiting = False
        self.replies.append(reply)
        self.messages.append({k: v for k, v in reply.items() if v is not None})
        if reply.get("tool_calls"):
            for call in reply["tool_calls"]:
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"ran {call['id']}"})
        else:
            self.messages.append({"role": "user", "content": f"go on ({len(self.replies)})"})
        return reply
