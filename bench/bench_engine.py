"""Local engine throughput: generated tokens per second at 1 and 8 concurrent requests, through HTTP.

    python bench/bench_engine.py                 # builds the tiny model in a temp dir
    python bench/bench_engine.py --model DIR --json

Each request asks what the interceptor asks (`prompt` as token ids, `return_token_ids`, `logprobs: 1`, a seed) and
`ignore_eos`, so every request generates exactly `--max-tokens` tokens. One warm-up request runs first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.engine import EngineConfig, LocalEngine  # noqa: E402

PROMPT_LEN = 64


async def run_level(session: aiohttp.ClientSession, *, concurrency: int, requests: int, max_tokens: int) -> dict:
    latencies: list[float] = []
    generated = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)

    async def client() -> None:
        nonlocal generated
        while not queue.empty():
            i = queue.get_nowait()
            body = {
                "prompt": [10 + (i * 31 + j * 7) % 500 for j in range(PROMPT_LEN)],
                "max_tokens": max_tokens,
                "seed": i,
                "ignore_eos": True,
                "return_token_ids": True,
                "logprobs": 1,
            }
            begin = time.perf_counter()
            async with session.post("/v1/completions", json=body) as response:
                payload = await response.json()
                if response.status != 200:
                    raise RuntimeError(payload)
            latencies.append(time.perf_counter() - begin)
            generated += len(payload["choices"][0]["token_ids"])

    begin = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(client())
    elapsed = time.perf_counter() - begin
    return {
        "concurrency": concurrency,
        "requests": requests,
        "tokens": generated,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(generated / elapsed, 1),
        "latency_p50_s": round(statistics.median(latencies), 3),
    }


async def bench(model: Path, *, max_tokens: int, threads: int) -> dict:
    config = EngineConfig(model=model, port=0, max_batch_size=8, threads=threads)
    async with LocalEngine(config) as engine:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(base_url=engine.base_url, timeout=timeout) as session:
            await run_level(session, concurrency=1, requests=1, max_tokens=16)  # warm-up
            levels = [
                await run_level(session, concurrency=1, requests=4, max_tokens=max_tokens),
                await run_level(session, concurrency=8, requests=16, max_tokens=max_tokens),
            ]
        return {"model": str(model), "max_tokens": max_tokens, "threads": threads,
                "peak_batch_size": engine.core.peak_batch_size, "levels": levels}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from trainer.models.tiny_model import make_tiny_model

            model = make_tiny_model(Path(scratch) / "tiny")
        results = asyncio.run(bench(model, max_tokens=args.max_tokens, threads=args.threads))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"local engine, {results['model']}, {args.max_tokens} tokens per request, {args.threads} thread(s)")
    print(f"{'concurrency':>11} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'p50 latency s':>14}")
    for level in results["levels"]:
        print(
            f"{level['concurrency']:>11} {level['requests']:>8} {level['tokens']:>7} {level['seconds']:>8} "
            f"{level['tokens_per_s']:>9} {level['latency_p50_s']:>14}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
