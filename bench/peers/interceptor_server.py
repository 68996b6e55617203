"""Interceptor's server as its own process, in either mode, with the HTTP admin API on.

    python bench/peers/interceptor_server.py --mode interception_gate --upstream URL --model DIR --record FILE
    python bench/peers/interceptor_server.py --mode black_box --upstream URL
    python bench/peers/interceptor_server.py ... --workers 2     # N worker processes behind one admin front
    python bench/peers/interceptor_server.py ... --off fast_lane  # an accelerator (or several) off
    BENCH_PROFILE=DIR python bench/peers/interceptor_server.py ...  # cProfile it: DIR/<mode>-<pid>.prof at stop

Prints {"url": ..., "admin_token": ...} on one line once it listens, and serves until SIGTERM. Rollouts are opened
with `POST /rollouts` (see interceptor/admin.py). With `--record`, every turn goes to the write-ahead journal beside
the record file and every finished rollout to the file, as in training (with `--workers N`, worker i's file is
`FILE` with `.wI` before its suffix; see interceptor/workers.py). Only warnings are logged (to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig  # noqa: E402
from interceptor.workers import ShardedServer  # noqa: E402

# The switches of the code that is there only for speed: ServerConfig's three and UpstreamConfig's lean_client.
ACCELERATORS = ("fast_lane", "lean_client", "tiktoken_twin", "suffix_writer")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        upstream=UpstreamConfig(base_url=args.upstream, lean_client="lean_client" not in args.off),
        mode=args.mode,
        model_dir=args.model,
        admin_token=secrets.token_urlsafe(16),
        record_path=args.record,
        default_max_tokens=args.default_max_tokens,
        **{name: False for name in args.off if name != "lean_client"},
    )


async def serve(config: ServerConfig, workers: int) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    server = InterceptionServer(config) if workers == 1 else ShardedServer(config, workers=workers)
    async with server:
        print(json.dumps({"url": server.url, "admin_token": config.admin_token}), flush=True)
        await stop.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("interception_gate", "black_box"), required=True)
    parser.add_argument("--upstream", required=True, help="the fake upstream's base URL")
    parser.add_argument("--model", type=Path, help="model directory (interception_gate)")
    parser.add_argument("--record", type=Path, help="JSON Lines file for finished rollouts")
    parser.add_argument("--workers", type=int, default=1, help="server processes (interceptor serve --workers)")
    parser.add_argument("--default-max-tokens", type=int, default=64,
                        help="max_tokens for requests that set none (bench_replay: the server's own default, as recorded)")
    parser.add_argument("--off", default="", type=lambda text: [t for t in text.split(",") if t],
                        help=f"accelerators to turn off, of {','.join(ACCELERATORS)}")
    args = parser.parse_args()
    if unknown := set(args.off) - set(ACCELERATORS):
        parser.error(f"no accelerator {sorted(unknown)}: they are {', '.join(ACCELERATORS)}")
    logging.basicConfig(level=logging.WARNING)
    if not (profile := os.environ.get("BENCH_PROFILE")):
        asyncio.run(serve(config_from_args(args), args.workers))
        return 0
    import cProfile  # a diagnostic: BENCH_PROFILE=DIR writes DIR/<mode>-<pid>.prof when the server stops

    with cProfile.Profile() as profiler:
        asyncio.run(serve(config_from_args(args), args.workers))
    profiler.dump_stats(Path(profile) / f"{args.mode}-{os.getpid()}.prof")
    return 0


if __name__ == "__main__":
    sys.exit(main())
