"""`interceptor serve`: the interception server as a standalone process, for a driver in another process.

Configuration comes from the command line; secrets only from the environment (never argv, which other users
of the machine can read): `INTERCEPTOR_ADMIN_TOKEN` (generated and written to `--admin-token-file` when unset)
and `INTERCEPTOR_UPSTREAM_API_KEY` (black_box upstreams that need one).

`--workers N` (N > 1) runs N worker processes behind a front that holds the admin API (interceptor/workers.py):
each rollout's base URL names its worker's port, and worker i records to `R.w{i}.jsonl` beside `--record R.jsonl`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import sys
from pathlib import Path

from interceptor.config import ServerConfig, UpstreamConfig
from interceptor.errors import ConfigError
from interceptor.workers import ShardedServer

__all__ = ["run_serve_from_args"]

log = logging.getLogger("interceptor.serve")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    admin_token = os.environ.get("INTERCEPTOR_ADMIN_TOKEN") or secrets.token_urlsafe(32)
    return ServerConfig(
        upstream=UpstreamConfig(
            base_url=args.upstream[0],
            replicas=tuple(args.upstream[1:]),
            api_key=os.environ.get("INTERCEPTOR_UPSTREAM_API_KEY"),
            lean_client=args.lean_client,
        ),
        mode=args.mode,
        model_dir=Path(args.model) if args.model else None,
        tiktoken_twin=args.tiktoken_twin,
        suffix_writer=args.suffix_writer,
        fast_lane=args.fast_lane,
        host=args.host,
        port=args.port,
        admin_token=admin_token,
        record_path=Path(args.record) if args.record else None,
        box_listen=args.box_listen,
        box_url=args.box_url,
    )


async def _serve(config: ServerConfig, token_file: Path | None, workers: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if workers == 1:
        from interceptor.server import InterceptionServer  # only here: a front with workers never loads the tokenizer stack

        server: InterceptionServer | ShardedServer = InterceptionServer(config)
    else:
        server = ShardedServer(config, workers=workers)
    async with server:  # with workers, this returns once every worker listens
        if token_file is not None:
            _write_private(token_file, config.admin_token + "\n")
        print(f"interception server ({config.mode}) listening on {server.url}", flush=True)
        if workers == 1 and server.box_port.url is not None:  # type: ignore[union-attr]
            print(f"rollout routes for boxes (box port) on {server.box_port.url}", flush=True)
        await stop.wait()


def _write_private(path: Path, text: str) -> None:
    """Write a secret to a file that is readable by its owner only from the moment it exists."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def run_serve_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        if args.workers > 1 and config.box_listen is not None:
            raise ConfigError("--box-listen serves one server's rollouts: it is not taken with --workers N > 1")
    except ConfigError as exc:  # the user's to fix: the reason, not a traceback
        print(f"interceptor serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(config, Path(args.admin_token_file) if args.admin_token_file else None, args.workers))
    except ConfigError as exc:  # found while starting (the record file another server holds): the same, no traceback
        print(f"interceptor serve: error: {exc}", file=sys.stderr)
        return 2
    return 0
