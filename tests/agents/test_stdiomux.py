"""stdiomux: many connections over one pipe pair, the box half a real process of its own, the host half `carry`.

No container here: the box half runs as the script it is inside one, and its pipes are the ones `docker exec -i`
would give; the far end is a real Unix-socket server on this host.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path

import pytest

from agents.sandbox import stdiomux

BOUND_S = 30.0


async def echo_server(path: Path) -> asyncio.AbstractServer:
    """Echoes what a connection sends, and answers its EOF with its own (a request, then a whole reply)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


async def box_half(socket: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-I", stdiomux.__file__, "--unix", str(socket),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)  # fmt: skip


async def test_parallel_connections_cross_whole_in_both_directions_and_the_box_half_ends_with_its_stdin(tmp_path):
    far, near = tmp_path / "far.sock", tmp_path / "near.sock"
    async with asyncio.timeout(BOUND_S), await echo_server(far):
        process = await box_half(near)
        hello = asyncio.Event()
        carrying = asyncio.create_task(stdiomux.carry(process.stdout, process.stdin, hello=hello,
                                                      connect=lambda: asyncio.open_unix_connection(str(far))))
        await hello.wait()
        assert near.stat().st_mode & 0o777 == 0o600

        async def call(size: int) -> bool:
            body = os.urandom(size)
            reader, writer = await asyncio.open_unix_connection(str(near))
            writer.write(body)
            await writer.drain()
            writer.write_eof()
            echoed = await reader.read()  # until the far end's EOF reaches us through the pipe
            writer.close()
            return hashlib.sha256(echoed).digest() == hashlib.sha256(body).digest()

        results = await asyncio.gather(*(call(size) for size in (0, 1, 65536, 65537, 3 * 1024 * 1024)))
        assert results == [True] * 5
        process.stdin.close()
        assert await process.wait() == 0
        await carrying  # the pipe ended: carry returns


async def test_a_stream_the_host_cannot_connect_is_closed_in_the_box_and_others_go_on(tmp_path):
    far, near = tmp_path / "far.sock", tmp_path / "near.sock"
    async with asyncio.timeout(BOUND_S):
        process = await box_half(near)
        hello, server = asyncio.Event(), None
        carrying = asyncio.create_task(stdiomux.carry(process.stdout, process.stdin, hello=hello,
                                                      connect=lambda: asyncio.open_unix_connection(str(far))))
        await hello.wait()
        reader, writer = await asyncio.open_unix_connection(str(near))  # nothing listens at `far` yet
        assert await reader.read() == b""
        writer.close()
        server = await echo_server(far)
        async with server:
            reader, writer = await asyncio.open_unix_connection(str(near))
            writer.write(b"ping")
            writer.write_eof()
            assert await reader.read() == b"ping"
            writer.close()
        process.stdin.close()
        await process.wait()
        await carrying


@pytest.mark.parametrize("header", [stdiomux.HEADER.pack(1, 9, 0), stdiomux.HEADER.pack(1, 2, 10**9)],
                         ids=["unknown-kind", "oversized"])
async def test_what_is_not_a_frame_ends_the_pipe_instead_of_being_read(header):
    reader = asyncio.StreamReader()
    reader.feed_data(header + b"x" * 16)
    reader.feed_eof()
    with pytest.raises(stdiomux.MuxClosed, match="not a frame"):
        await stdiomux.read_frame(reader)


async def test_a_stream_whose_reader_falls_behind_is_closed_and_the_others_go_on(tmp_path):
    far, near, stalled = tmp_path / "far.sock", tmp_path / "near.sock", tmp_path / "stalled.sock"
    held: list[asyncio.StreamWriter] = []

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    targets = iter([stalled, far])
    async with asyncio.timeout(BOUND_S), await echo_server(far), await asyncio.start_unix_server(
            never_reads, path=str(stalled)):  # fmt: skip
        process = await box_half(near)
        hello = asyncio.Event()
        carrying = asyncio.create_task(stdiomux.carry(process.stdout, process.stdin, hello=hello,
                                                      connect=lambda: asyncio.open_unix_connection(str(next(targets)))))
        await hello.wait()
        flood_reader, flood = await asyncio.open_unix_connection(str(near))
        with pytest.raises(ConnectionError):  # the box closes it once the host holds STREAM_BUFFER for it
            for _ in range(4 * stdiomux.STREAM_BUFFER // 65536):
                flood.write(b"x" * 65536)
                await flood.drain()
        reader, writer = await asyncio.open_unix_connection(str(near))
        writer.write(b"still here")
        writer.write_eof()
        assert await reader.read() == b"still here"
        process.stdin.close()
        await process.wait()
        await carrying
