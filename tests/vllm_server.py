"""Run a real vLLM OpenAI server for tests: the CPU build, from its own venv (scripts/setup-vllm.sh).

Contract:
- `vllm_venv_python()` is the venv's interpreter: `$INTERCEPTOR_VLLM_VENV/bin/python`, by default under
  `~/.cache/interceptor/vllm-venv`. `require_vllm_python()` returns it when it can import vLLM; otherwise it skips
  the calling test with a message saying how to set it up, or, under CI (`CI=true`), fails it, so a broken CI image
  cannot turn the vLLM tests green by skipping them.
- `async with start_vllm(model_dir, python=..., log_dir=...) as server:` starts
  `python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32 --enforce-eager` on 127.0.0.1 and a free
  port, with the dev endpoints on (`/pause`, `/resume`, `/collective_rpc`), waits for `/health` and yields a
  `VllmServer`. The server gets its own process group and is stopped as a group on exit: vLLM forks an engine core
  and a worker (plus a multiprocessing resource tracker), and signalling only the parent can leave them behind.
- A server that exits or does not answer `/health` in time raises `VllmStartError` with the tail of its log. The
  whole log is kept in `log_dir`.

On a 2-core machine vLLM's default thread binding (`VLLM_CPU_OMP_THREADS_BIND=auto`) binds the model's OpenMP
threads to core 0 and leaves core 1 to the API server and engine loop; that works, so it is left alone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

__all__ = ["VllmServer", "VllmStartError", "require_vllm_python", "start_vllm", "vllm_venv_python"]

DEFAULT_VENV = Path.home() / ".cache" / "interceptor" / "vllm-venv"
# A cold start takes ~30-50 s on 2 cores (imports dominate: the API server, engine core and worker each import
# torch and vLLM); a loaded CI runner can be several times slower.
STARTUP_TIMEOUT_S = 600.0
HEALTH_POLL_S = 0.5
# A running server exits 1-3 s after SIGTERM. One still starting up does not exit at all (seen: the API server
# hangs on its dead engine core), so SIGKILL follows the grace period.
SHUTDOWN_GRACE_S = 10.0
LOG_TAIL_LINES = 60

SERVER_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",  # /pause, /resume, /collective_rpc, /reset_prefix_cache
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default 4 GiB is wasted on a tiny model (1 GiB holds 2M tokens here)
    "VLLM_NO_USAGE_STATS": "1",  # no usage report over the network
    "HF_HUB_OFFLINE": "1",  # the model is a local directory; never reach for the Hub
    "TRANSFORMERS_OFFLINE": "1",
}
# Inherited variables that would mix the test process's Python environment into the vLLM venv.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


class VllmStartError(RuntimeError):
    """vLLM exited or did not become healthy; the message ends with the tail of its log."""


@dataclass(frozen=True, kw_only=True)
class VllmServer:
    base_url: str  # http://127.0.0.1:PORT, without /v1
    model_dir: Path  # what --model was given; also the served model name
    log_path: Path


def vllm_venv_python() -> Path:
    venv = os.environ.get("INTERCEPTOR_VLLM_VENV")
    return (Path(venv) if venv else DEFAULT_VENV) / "bin" / "python"


def require_vllm_python() -> Path:
    """The vLLM venv's python, or skip (fail under CI) with what to run."""
    python = vllm_venv_python()
    problem = _vllm_venv_problem(python)
    if problem is None:
        return python
    message = f"{problem}; create it with scripts/setup-vllm.sh (or point INTERCEPTOR_VLLM_VENV at one)"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"vLLM tests cannot run under CI: {message}", pytrace=False)
    pytest.skip(message)


def _vllm_venv_problem(python: Path) -> str | None:
    if not python.exists():
        return f"no vLLM venv at {python.parent.parent}"
    # find_spec instead of `import vllm`: same answer for an intact install, 50 ms instead of 5 s.
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
        capture_output=True,
        timeout=60,
    )
    if probe.returncode != 0:
        return f"{python} cannot find the vllm package"
    return None


@asynccontextmanager
async def start_vllm(
    model_dir: Path,
    *,
    python: Path,
    log_dir: Path,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
) -> AsyncIterator[VllmServer]:
    port = _free_port()
    log_path = Path(log_dir) / f"vllm-{port}.log"
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--dtype", "float32",  # the tiny model is fp32, and fp32 keeps logprobs within ~1e-6 of transformers
        "--enforce-eager",  # skips the torch.compile warm-up: ~20 s of every cold start on 2 cores, for a tiny model
        "--host", "127.0.0.1",
        "--port", str(port),
        *extra_args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV} | SERVER_ENV
    server = VllmServer(base_url=f"http://127.0.0.1:{port}", model_dir=Path(model_dir), log_path=log_path)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        await _wait_healthy(server, process, startup_timeout_s)
        yield server
    finally:
        await asyncio.to_thread(_stop_group, process)


def _free_port() -> int:
    # vLLM takes a port number, not a socket, so there is a small window in which another process could take it;
    # binding port 0 and releasing it is the usual compromise.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _wait_healthy(server: VllmServer, process: subprocess.Popen, timeout_s: float) -> None:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            if process.poll() is not None:
                raise VllmStartError(
                    f"vLLM exited with code {process.returncode} before answering /health\n{_log_tail(server)}"
                )
            if await _is_healthy(session, server.base_url):
                return
            if time.monotonic() - started > timeout_s:
                raise VllmStartError(f"vLLM did not answer /health within {timeout_s:.0f} s\n{_log_tail(server)}")
            await asyncio.sleep(HEALTH_POLL_S)


async def _is_healthy(session: aiohttp.ClientSession, base_url: str) -> bool:
    try:
        async with session.get(f"{base_url}/health") as response:
            return response.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False  # not listening yet, or busy loading


def _log_tail(server: VllmServer) -> str:
    with open(server.log_path, encoding="utf-8", errors="replace") as log:
        tail = "".join(deque(log, maxlen=LOG_TAIL_LINES))
    return f"--- last {LOG_TAIL_LINES} lines of {server.log_path} ---\n{tail}"


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group; SIGKILL it if anything is left after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        if _wait_group_gone(process, SHUTDOWN_GRACE_S):
            return


def _wait_group_gone(process: subprocess.Popen, timeout_s: float) -> bool:
    # The group outlives the parent for a moment: the engine core and worker exit after it.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process.poll()  # reap the parent, or it stays in the group as a zombie
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
