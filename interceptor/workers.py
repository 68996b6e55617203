"""`interceptor serve --workers N`: the interception server as N worker processes, rollouts sharded among them.

    async with ShardedServer(config, workers=2) as server:   # server.url: the front (admin API and /health)
        ...                                                  # each rollout's base_url names its worker's port

Python's event loop uses one core; N workers use N. Each worker is an `InterceptionServer` in its own process
(multiprocessing's spawn context: nothing is forked) on its own port (port 0, the configured host and public host),
so a rollout's base URL names its worker and an agent's turns go to it directly, with no hop through the parent.
The parent serves the *front* on the configured host:port: the admin API (interceptor/admin.py's routes, token and
error shape) and `/health` (every worker: up or not, its live rollouts). `POST /rollouts` goes to the up worker
with the fewest live rollouts the front opened and has not seen finish (ties round robin), and the worker's answer
comes back unchanged; calls about a rollout go to the worker that holds it. An id the front never opened is a 404;
a rollout on a worker that died answers 503 (`worker_unavailable`), and opening avoids that worker.

Records: worker i writes `R.w{i}.jsonl` beside the configured `R.jsonl` (`worker_record_path`), with its own
journal and its own crash recovery: restart with the same N so each worker recovers its own file. The admin token
reaches the workers inside the pickled configuration, through the spawn pipe, never argv. Stop, in this order: the
front closes (in-flight admin calls get the grace), then every worker gets SIGTERM and writes its live rollouts as
`interrupted`, as a single server does, and is joined. Ctrl-C reaches the whole process group, so workers ignore
SIGINT and wait for the parent's order; a worker whose parent died (its end of the pipe closed) stops the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import signal
from collections import OrderedDict
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web

from interceptor.admin import authorize_admin
from interceptor.config import ServerConfig
from interceptor.errors import NotFound, WorkerUnavailable, errors_middleware_for, json_response

__all__ = ["ShardedServer", "worker_record_path"]

log = logging.getLogger("interceptor.workers")

READY_TIMEOUT_S = 120.0  # a worker imports transformers and loads the tokenizer; N load at once on few cores
STOP_EXTRA_S = 30.0  # past the server's shutdown grace: time for a worker to write its live rollouts' records
KILL_WAIT_S = 5.0  # after SIGKILL, the exit is immediate; this only bounds a wait that cannot hang
HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=2.0)  # a worker that cannot answer /health this fast is reported down
# Forwarded admin calls have no total bound, as against a single server: a finish writes and fsyncs a record.
FORWARD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
FINISHED_KEPT = 100_000  # finished ids still routed (GET shows their status, a second finish its 409), as workers keep


def worker_record_path(path: Path, index: int) -> Path:
    """Worker `index`'s record file beside the configured one: `rollouts.jsonl` -> `rollouts.w0.jsonl`."""
    return path.with_name(f"{path.stem}.w{index}{path.suffix}")


def worker_config(config: ServerConfig, index: int) -> ServerConfig:
    record_path = worker_record_path(config.record_path, index) if config.record_path is not None else None
    return dataclasses.replace(config, port=0, record_path=record_path)


# ------------------------------------------------------------------------------------------ a worker process


def _worker_main(config: ServerConfig, conn: Connection) -> None:
    """A worker process's entry point (spawned: a fresh interpreter that imports this module)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C hits the whole group; the parent orders the stop
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s")
    asyncio.run(_serve_worker(config, conn))


async def _serve_worker(config: ServerConfig, conn: Connection) -> None:
    from interceptor.server import InterceptionServer  # here, not above: the parent never loads the tokenizer stack (~3 s)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def parent_gone() -> None:  # the parent never writes: readable means its end closed, so it died
        loop.remove_reader(conn.fileno())
        stop.set()

    loop.add_reader(conn.fileno(), parent_gone)
    async with AsyncExitStack() as stack:
        try:
            server = await stack.enter_async_context(InterceptionServer(config))
        except Exception as exc:  # told to the parent, which fails its start with it; the traceback goes to stderr
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
            raise
        conn.send(("ready", server.url))
        await stop.wait()


# ------------------------------------------------------------------------------------ the parent's view of one


@dataclass(eq=False)
class Worker:
    index: int
    process: BaseProcess
    conn: Connection  # the parent's end of the pipe: the ready message comes here; closing it stops an orphan
    url: str = ""  # where the front reaches it (the configured host, or loopback when that is a wildcard)
    public_url: str = ""  # what its rollouts' base URLs start with
    live: set[str] = field(default_factory=set)  # rollouts the front opened here and has not seen finish
    opening: int = 0  # POST /rollouts in flight to it: counted, so concurrent opens spread too

    @property
    def up(self) -> bool:
        return self.process.is_alive()


async def _readable(fd: int, timeout: float) -> bool:
    """Wait until `fd` is readable (a message, an end of file, a process sentinel's exit); False on timeout."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        async with asyncio.timeout(timeout):
            await ready
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


async def _stop_worker(worker: Worker, timeout: float) -> None:
    if worker.process.is_alive():
        worker.process.terminate()  # SIGTERM: it stops taking requests, then writes its live rollouts
        if not await _readable(worker.process.sentinel, timeout):
            log.error("worker %d did not stop within %.0f s; killing it (its journal keeps its rollouts)",
                      worker.index, timeout)
            worker.process.kill()
            await _readable(worker.process.sentinel, KILL_WAIT_S)
    worker.process.join(0)
    worker.conn.close()
    if worker.process.exitcode not in (0, None):
        log.warning("worker %d exited with status %s", worker.index, worker.process.exitcode)


# ------------------------------------------------------------------------------------------------- the front


class ShardedServer:
    def __init__(self, config: ServerConfig, *, workers: int) -> None:
        if workers < 2:
            raise ValueError("a sharded server has at least 2 workers; run InterceptionServer for one")
        self.config = config
        self.count = workers
        self.workers: list[Worker] = []
        self._routes: dict[str, Worker] = {}  # live rollouts the front opened -> their worker
        self._finished: OrderedDict[str, Worker] = OrderedDict()
        self._next = 0  # round robin among the least loaded
        self._http: aiohttp.ClientSession | None = None
        self._stack = AsyncExitStack()
        self._port: int | None = None

    async def __aenter__(self) -> ShardedServer:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()  # undo a half-finished start: stop the workers already spawned
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._stack.aclose()

    async def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # never fork: the parent may hold threads (tokenizers, loop)
        self._stack.push_async_callback(self._stop_workers)  # registered before the first worker exists
        for index in range(self.count):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_worker_main, args=(worker_config(self.config, index), child_end),
                                      name=f"worker-{index}")
            self.workers.append(Worker(index=index, process=process, conn=parent_end))
            process.start()
            child_end.close()  # the child holds its own copy: a worker that dies reads as an end of file here
        for worker in self.workers:  # all spawned first, so they load at once; then each is awaited in turn
            await self._await_ready(worker)
        for worker in self.workers:
            asyncio.get_running_loop().add_reader(worker.process.sentinel, self._exited, worker)
        self._http = await self._stack.enter_async_context(aiohttp.ClientSession(timeout=FORWARD_TIMEOUT))
        app = web.Application(middlewares=[errors_middleware_for()], client_max_size=self.config.max_body_bytes)
        app.router.add_get("/health", self._health)
        app.router.add_post("/rollouts", self._open)
        app.router.add_get("/rollouts/{rid}", self._about)
        app.router.add_post("/rollouts/{rid}/finish", self._finish)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.config.shutdown_grace_s)
        await runner.setup()
        # Exit runs in reverse: the front stops taking admin calls (in-flight ones get the grace), then the
        # client closes, then the workers stop (each writes its live rollouts as `interrupted`).
        self._stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, self.config.host, self.config.port).start()
        self._port = runner.addresses[0][1]
        log.info("interception server (%s), %d workers, front on %s", self.config.mode, self.count, self.url)

    async def _await_ready(self, worker: Worker) -> None:
        if not await _readable(worker.conn.fileno(), READY_TIMEOUT_S):
            raise RuntimeError(f"worker {worker.index} did not listen within {READY_TIMEOUT_S:.0f} s")
        try:
            kind, detail = worker.conn.recv()
        except EOFError:
            kind, detail = "failed", f"it exited with status {worker.process.exitcode} before it listened"
        if kind != "ready":
            raise RuntimeError(f"worker {worker.index} did not start: {detail}")
        host = self.config.host if self.config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        log.info("worker %d (pid %d) serves rollouts on %s", worker.index, worker.process.pid, detail)
        worker.public_url, worker.url = detail, f"http://{host}:{urlsplit(detail).port}"

    def _exited(self, worker: Worker) -> None:
        """A worker died while serving: /health reports it, opening avoids it, its rollouts answer 503."""
        asyncio.get_running_loop().remove_reader(worker.process.sentinel)
        worker.process.join(0)
        log.error("worker %d exited (status %s); its %d live rollouts answer 503", worker.index,
                  worker.process.exitcode, len(worker.live))

    async def _stop_workers(self) -> None:
        started = [w for w in self.workers if w.process.pid is not None]
        for worker in started:  # exits from here on are ordered, not deaths
            asyncio.get_running_loop().remove_reader(worker.process.sentinel)
        timeout = self.config.shutdown_grace_s + STOP_EXTRA_S
        await asyncio.gather(*(_stop_worker(w, timeout) for w in started))

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the server is not running")
        return f"http://{self.config.public_host or self.config.host}:{self._port}"

    # -------------------------------------------------------------------------------------------- handlers

    def _authorize(self, request: web.Request) -> None:
        authorize_admin(request, self.config.admin_token)

    def _pick(self, avoid: set[int]) -> Worker:
        """The up worker with the fewest live rollouts (opens in flight count), ties round robin."""
        up = [w for w in self.workers if w.up and w.index not in avoid]
        if not up:
            raise WorkerUnavailable("no worker is up")
        chosen = min(up, key=lambda w: (len(w.live) + w.opening, (w.index - self._next) % self.count))
        self._next = (chosen.index + 1) % self.count
        return chosen

    def _holder(self, rollout_id: str) -> Worker:
        worker = self._routes.get(rollout_id) or self._finished.get(rollout_id)
        if worker is None:
            raise NotFound(f"no live rollout {rollout_id!r}")
        if not worker.up:
            raise WorkerUnavailable(f"the worker holding rollout {rollout_id!r} is down")
        return worker

    async def _open(self, request: web.Request) -> web.Response:
        self._authorize(request)
        body = await request.read()
        unreachable: set[int] = set()
        while True:
            worker = self._pick(avoid=unreachable)
            worker.opening += 1
            try:
                status, raw, response = await self._forward(worker, request, body)
                break
            except WorkerUnavailable as exc:
                if not isinstance(exc.__cause__, aiohttp.ClientConnectorError):
                    raise
                unreachable.add(worker.index)  # it never got the call (it is dying): another worker takes it
            finally:
                worker.opening -= 1
        if status == 201:
            rollout_id = orjson.loads(raw)["id"]
            worker.live.add(rollout_id)
            self._routes[rollout_id] = worker
        return response

    async def _about(self, request: web.Request) -> web.Response:
        self._authorize(request)
        _, _, response = await self._forward(self._holder(request.match_info["rid"]), request, b"")
        return response

    async def _finish(self, request: web.Request) -> web.Response:
        self._authorize(request)
        rollout_id = request.match_info["rid"]
        body = await request.read()
        worker = self._holder(rollout_id)
        status, _, response = await self._forward(worker, request, body)
        if status == 200 and self._routes.pop(rollout_id, None) is not None:
            worker.live.discard(rollout_id)
            self._finished[rollout_id] = worker
            while len(self._finished) > FINISHED_KEPT:
                self._finished.popitem(last=False)
        return response

    async def _forward(self, worker: Worker, request: web.Request, body: bytes) -> tuple[int, bytes, web.Response]:
        """The same call to the worker's admin API; its status and body, and them as the front's response."""
        assert self._http is not None
        headers = {"Authorization": request.headers.get("Authorization", ""), "Content-Type": "application/json"}
        try:
            async with self._http.request(request.method, worker.url + request.raw_path, data=body,
                                          headers=headers) as answer:
                raw = await answer.read()
        except aiohttp.ClientError as exc:
            raise WorkerUnavailable(f"worker {worker.index} did not answer: {type(exc).__name__}") from exc
        passed = {"Retry-After": answer.headers["Retry-After"]} if "Retry-After" in answer.headers else None
        response = web.Response(body=raw, status=answer.status, content_type=answer.content_type, headers=passed)
        return answer.status, raw, response

    async def _health(self, request: web.Request) -> web.Response:
        rows = await asyncio.gather(*(self._worker_health(w) for w in self.workers))
        up = sum(row["up"] for row in rows)
        body = {
            "status": "ok" if up == len(rows) else "degraded" if up else "down",
            "mode": self.config.mode,
            "workers_up": up,
            "live_rollouts": sum(row["live_rollouts"] for row in rows if row["up"]),
            "workers": rows,
        }
        return json_response(body, status=200 if up else 503)

    async def _worker_health(self, worker: Worker) -> dict:
        row = {"index": worker.index, "url": worker.public_url, "pid": worker.process.pid, "up": False,
               "live_rollouts": len(worker.live)}
        if not worker.up:
            return row  # live_rollouts: those it held when it died
        assert self._http is not None
        try:
            async with self._http.get(worker.url + "/health", timeout=HEALTH_TIMEOUT) as answered:
                answer = orjson.loads(await answered.read()) if answered.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            answer = None
        if isinstance(answer, dict):
            row |= {"up": True, "live_rollouts": answer.get("live_rollouts", 0)}
        return row
