"""An interception server in a child process, for benchmarks whose load comes from the parent.

    with ChildServer(admin_token="t", log_path=Path("server.log")) as server:
        server.port, server.pid        # 127.0.0.1 only; the pid is for sampling the server's memory

The child runs `interception_gate` over the scripted fake upstream (`tests/fakes.py`, which answers "ok" at once)
with the admin API on. Load generator and server then share no interpreter, and the child's RSS is the server's
(plus the stateless fake upstream): the tiny model is built beforehand in a third, short-lived process, so torch
is never imported by the server. Warnings and errors (aiohttp's tracebacks of 500s) go to `log_path`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import multiprocessing
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["ChildServer"]

_START_TIMEOUT_S = 180.0  # building the tiny model imports torch: seconds on 2 cores, more on a busy machine
_STOP_TIMEOUT_S = 30.0


class ChildServer:
    def __init__(self, *, admin_token: str, record_path: Path | None = None, log_path: Path | None = None) -> None:
        self._admin_token = admin_token
        self._record_path = record_path
        self._log_path = log_path
        self._context = multiprocessing.get_context("spawn")  # never fork a process that may hold threads
        self._model_dir = tempfile.TemporaryDirectory(prefix="interceptor-bench-")
        self.url = ""

    def __enter__(self) -> ChildServer:
        model_dir = Path(self._model_dir.name) / "tiny"
        builder = self._context.Process(target=_build_model, args=(model_dir,), name="build-tiny-model")
        builder.start()
        builder.join(_START_TIMEOUT_S)
        if builder.exitcode != 0:
            builder.kill()
            self._model_dir.cleanup()
            raise RuntimeError(f"building the tiny model failed (exit code {builder.exitcode})")
        self._conn, child_conn = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve_in_child,
            args=(child_conn, model_dir, self._admin_token, self._record_path, self._log_path),
            name="interceptor-server",
        )
        self._process.start()
        child_conn.close()
        try:
            if not self._conn.poll(_START_TIMEOUT_S):
                raise RuntimeError(f"the server did not start within {_START_TIMEOUT_S:.0f} s")
            kind, detail = self._conn.recv()
            if kind != "ready":
                raise RuntimeError(f"the server did not start: {detail}")
        except BaseException:
            self._stop()
            raise
        self.url = detail
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        return self._process.pid

    def _stop(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send("stop")
        self._process.join(_STOP_TIMEOUT_S)
        if self._process.is_alive():  # it did not shut down in time: end it (our own child, by its handle)
            self._process.terminate()
            self._process.join(_STOP_TIMEOUT_S)
        self._conn.close()
        self._model_dir.cleanup()


def _build_model(model_dir: Path) -> None:
    from trainer.models.tiny_model import make_tiny_model

    make_tiny_model(model_dir)


def _serve_in_child(conn, model_dir: Path, admin_token: str, record_path: Path | None, log_path: Path | None) -> None:
    logging.basicConfig(filename=log_path, level=logging.WARNING)
    try:
        asyncio.run(_serve(conn, model_dir, admin_token, record_path))
    except Exception as exc:  # reported to the parent, which is waiting for "ready"
        with contextlib.suppress(OSError):
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise


async def _serve(conn, model_dir: Path, admin_token: str, record_path: Path | None) -> None:
    from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
    from tests.fakes import ScriptedUpstream

    async with ScriptedUpstream(model_dir) as upstream:
        upstream.calls = collections.deque(maxlen=16)  # the fake keeps every call; a benchmark makes 100,000s
        config = ServerConfig(
            upstream=UpstreamConfig(base_url=upstream.url),
            model_dir=model_dir,
            admin_token=admin_token,
            record_path=record_path,
        )
        async with InterceptionServer(config) as server:
            conn.send(("ready", server.url))
            await asyncio.to_thread(_wait_for_stop, conn)


def _wait_for_stop(conn) -> None:
    with contextlib.suppress(EOFError, OSError):  # EOF: the parent is gone, which also means stop
        conn.recv()
