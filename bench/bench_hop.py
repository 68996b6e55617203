"""What one relay hop between processes costs on this machine, warm and cold: a floor for any proxy.

    python bench/bench_hop.py [--work-us 0] [--idle-ms 20] [--rounds 3000]

Three processes, as in bench_gate.py: an upstream that answers a 600-byte body at once, a relay (bare asyncio
streams: read the request, send it upstream, read the answer, send it back) and this client, which alternates a
direct call and a call through the relay, 8 KB each, and prints the p50 of each and the difference (the hop). Run
back to back (warm), then with `--idle-ms` of sleep after every pair (cold: caches and idle CPUs are what the other
proxies' turns leave a target with in the interleaved run). `--work-us` spins that long in the relay before each of
its two sends: CPU work that touches no memory, which a cold start does not slow.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

_BODY = b"x" * 8000
_ANSWER = b"y" * 600


async def _read(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readline()).strip())
    return await reader.readexactly(size)


def _frame(body: bytes) -> bytes:
    return b"%d\n" % len(body) + body


async def _listen(handle) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


async def upstream() -> None:
    async def handle(reader, writer):
        while True:
            try:
                await _read(reader)
            except (asyncio.IncompleteReadError, ValueError):
                return
            writer.write(_frame(_ANSWER))

    await _listen(handle)


def _spin(us: float) -> None:
    started = time.perf_counter()
    while (time.perf_counter() - started) * 1e6 < us:
        pass


async def relay(upstream_port: int, work_us: float) -> None:
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)

    async def handle(reader, writer):
        while True:
            try:
                body = await _read(reader)
            except (asyncio.IncompleteReadError, ValueError):
                return
            _spin(work_us)
            up_writer.write(_frame(body))
            answer = await _read(up_reader)
            _spin(work_us)
            writer.write(_frame(answer))

    await _listen(handle)


async def client(upstream_port: int, relay_port: int, rounds: int, idle_s: float) -> tuple[float, float]:
    connections = {name: await asyncio.open_connection("127.0.0.1", port)
                   for name, port in (("direct", upstream_port), ("relay", relay_port))}
    seconds: dict[str, list[float]] = {"direct": [], "relay": []}
    for i in range(rounds):
        for name in ("direct", "relay") if i % 2 else ("relay", "direct"):
            reader, writer = connections[name]
            started = time.perf_counter()
            writer.write(_frame(_BODY))
            await _read(reader)
            seconds[name].append(time.perf_counter() - started)
        if idle_s:
            await asyncio.sleep(idle_s)
    return tuple(sorted(v)[len(v) // 2] * 1e6 for v in (seconds["direct"], seconds["relay"]))  # type: ignore[return-value]


def _start(*args: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--upstream":
        asyncio.run(upstream())
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--relay":
        asyncio.run(relay(int(sys.argv[2]), float(sys.argv[3])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-us", type=float, default=0.0, help="CPU spin in the relay before each of its sends")
    parser.add_argument("--idle-ms", type=float, default=20.0, help="sleep after each pair in the cold measure")
    parser.add_argument("--rounds", type=int, default=3000, help="pairs in the warm measure (a fifth when cold)")
    args = parser.parse_args()
    up, up_port = _start("--upstream")
    hop, hop_port = _start("--relay", str(up_port), str(args.work_us))
    try:
        for label, rounds, idle in (("warm", args.rounds, 0.0), ("cold", args.rounds // 5, args.idle_ms / 1000)):
            direct, relayed = asyncio.run(client(up_port, hop_port, rounds, idle))
            print(f"{label}: direct {direct:.0f} us p50, through the relay {relayed:.0f} us, "
                  f"the hop (relay work {2 * args.work_us:.0f} us included) {relayed - direct:.0f} us")
    finally:
        for process in (up, hop):
            process.kill()
            process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
