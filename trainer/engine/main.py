"""`interceptor engine`: serve a model with the local engine until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from trainer.engine.config import EngineConfig
from trainer.engine.engine import LocalEngine

__all__ = ["config_from_args", "run_engine_from_args"]

log = logging.getLogger("trainer.engine")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name or args.model,  # vLLM serves the --model string as given
        max_model_len=args.max_model_len,
        logprobs_mode=args.logprobs_mode,
        max_batch_size=args.max_batch_size,
        prefix_cache_mib=args.prefix_cache_mib,
        threads=args.threads,
        device=args.device,
        dtype=args.dtype,
    )


def run_engine_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    asyncio.run(_serve(config))
    return 0


async def _serve(config: EngineConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with LocalEngine(config) as engine:
        log.info(
            "serving %s (max_model_len %d, %s, %s on %s) at %s/v1",
            engine.model_name, engine.core.max_model_len, config.logprobs_mode, config.dtype, config.device,
            engine.base_url,
        )
        await stop.wait()
        log.info("stopping")
