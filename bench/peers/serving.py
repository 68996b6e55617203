"""What every server script here does once its app is built: listen on a free loopback port, print its URL as one
JSON line (what `launch.py` waits for), and serve until SIGINT or SIGTERM. The scripts run as programs, each from
its own venv, so they import this module by name from their own folder."""

from __future__ import annotations

import asyncio
import json
import signal

from aiohttp import web

__all__ = ["serve_until_stopped", "start_app"]


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve `app` on a free loopback port in this process: its runner (to clean up) and its URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def serve_until_stopped(app: web.Application) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        print(json.dumps({"url": f"http://127.0.0.1:{runner.addresses[0][1]}"}), flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
