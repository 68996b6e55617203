"""What one very large chat request does to every other rollout: the healthy rollouts' worst latency while it
is being answered, measured from a separate process.

    python bench/bench_heavy_request.py [--megabytes 10] [--json OUT]

The server runs in a child process (`bench/child_server.py`: interception_gate over the scripted fake upstream,
admin API on). From this process, one client sends a fresh conversation of about `--megabytes` MB (3,000+
user/assistant turns: a fork, so the whole conversation is rendered and tokenized; with the tiny model's 4k
context it is then refused as too long, which is the point: the work happens before the context check), while
another client runs one `/health` call and one short chat turn (each with new content) back to back on its own
rollout. Printed: how long the large request took and what it answered, and the healthy client's p50 and worst
latency before it and during it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402

from bench.child_server import ChildServer  # noqa: E402

ADMIN = "bench-admin-token"


def _big_conversation(megabytes: float) -> list[dict]:
    line = "The quick brown fox jumps over the lazy dog while counting to forty-two. "
    messages, size = [], 0
    while size < megabytes * 1_000_000:
        content = line * 40
        messages.append({"role": "user" if len(messages) % 2 == 0 else "assistant", "content": content})
        size += len(content) + 40
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": "and now?"})
    return messages


async def _open(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.post(url + "/rollouts", json={}, headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        assert resp.status == 201, resp.status
        return await resp.json()


async def _healthy(http: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> list[float]:
    rollout = await _open(http, url)
    headers = {"Authorization": f"Bearer {rollout['secret']}"}
    latencies, n = [], 0
    while not stop.is_set():
        n += 1
        body = {"model": "policy", "messages": [{"role": "user", "content": f"hi {n}"}], "max_tokens": 4}
        started = time.perf_counter()
        async with http.get(url + "/health") as resp:
            await resp.read()
        async with http.post(rollout["base_url"] + "/chat/completions", json=body, headers=headers) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        latencies.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.005)
    return latencies


async def _measure(url: str, payload: bytes) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        stop = asyncio.Event()
        baseline = asyncio.create_task(_healthy(http, url, stop))
        await asyncio.sleep(3.0)
        stop.set()
        alone = await baseline
        heavy = await _open(http, url)
        stop = asyncio.Event()
        during_task = asyncio.create_task(_healthy(http, url, stop))
        await asyncio.sleep(0.2)
        started = time.perf_counter()
        async with http.post(heavy["base_url"] + "/chat/completions", data=payload,
                             headers={"Authorization": f"Bearer {heavy['secret']}",
                                      "Content-Type": "application/json"}) as resp:
            answer = (await resp.read())[:120].decode(errors="replace")
            status = resp.status
        heavy_s = time.perf_counter() - started
        stop.set()
        during = await during_task
    return {
        "heavy_status": status,
        "heavy_answer": answer,
        "heavy_s": round(heavy_s, 2),
        "alone_p50_ms": round(statistics.median(alone), 2),
        "alone_worst_ms": round(max(alone), 2),
        "during_turns": len(during),
        "during_p50_ms": round(statistics.median(during), 2),
        "during_worst_ms": round(max(during), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=10.0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    messages = _big_conversation(args.megabytes)
    payload = json.dumps({"model": "policy", "messages": messages, "max_tokens": 4}).encode()
    with ChildServer(admin_token=ADMIN) as server:
        results = {"body_mb": round(len(payload) / 1e6, 2), "messages": len(messages),
                   **asyncio.run(_measure(server.url, payload))}
    for key, value in results.items():
        print(f"{key:>16}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
