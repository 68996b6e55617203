"""Many byte streams over one pipe pair: how a box that shares no file system with the host reaches its endpoint.

The bridge of `agents.sandbox.netbridge` forwards the agent's connections to a Unix socket. Where that socket cannot
be the host's (a container whose rollout directory is a volume of the daemon, not a bind mount of this host), the
socket is served inside the box by this module run as a script, started with `docker exec -i`: every connection to it
becomes a stream of frames on the script's stdout, and the host half (`carry`) opens one connection per stream to the
host bridge's socket, whose guard (rollout routes only, a cap on connections) applies unchanged.

    box:   python3 -I stdiomux.py --unix ROOT/.interceptor/model.sock        (stdin/stdout: the exec's pipes)
    host:  await carry(exec_stdout, exec_stdin, connect=lambda: asyncio.open_unix_connection(host_socket))

A frame is a 9-byte header (stream id, kind, payload length; big-endian `>IBI`) and its payload. The box says HELLO
once its socket listens, OPENs a stream per connection, then both sides send DATA, EOF (no more data this way) and
CLOSE (the stream is gone). Each side reads a connection only as fast as the pipe drains, and hands a frame's data to
its connection without waiting for it to be read, so a connection that is not read never holds up the others (or
deadlocks a reply streamed back while its request is still being sent); past `STREAM_BUFFER` bytes waiting for its
reader, that one stream is closed.

Stdlib only: this file also runs as a plain script on the image's Python (3.8 or later).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["MAX_FRAME", "STREAM_BUFFER", "MuxClosed", "carry", "main", "read_frame"]

HEADER = struct.Struct(">IBI")
HELLO, OPEN, DATA, EOF, CLOSE = range(5)
MAX_FRAME = 64 * 1024  # the most payload one frame carries (a read of a connection)
# What one stream may have waiting for its reader; past it the stream is closed (the pipe and the others go on).
STREAM_BUFFER = 16 * 1024 * 1024

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class MuxClosed(Exception):
    """The pipe ended, or carried something that is not a frame."""


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    try:
        stream, kind, length = HEADER.unpack(await reader.readexactly(HEADER.size))
        if kind > CLOSE or length > MAX_FRAME:
            raise MuxClosed(f"not a frame: kind {kind}, {length} bytes")
        return stream, kind, await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError:
        raise MuxClosed("the pipe ended") from None


async def _frames(reader: asyncio.StreamReader) -> AsyncIterator[tuple[int, int, bytes]]:
    """Every frame until the pipe ends (or carries something that is not a frame)."""
    while True:
        try:
            frame = await read_frame(reader)
        except MuxClosed:
            return
        yield frame


class _Ends:
    """One side's streams by id, and the frames it sends for them (one writer for the pipe)."""

    def __init__(self, pipe: asyncio.StreamWriter) -> None:
        self.pipe = pipe
        self.streams: dict[int, asyncio.StreamWriter] = {}
        self.tasks: set[asyncio.Task] = set()
        self._sent_eof: set[int] = set()
        self._got_eof: set[int] = set()

    async def send(self, stream: int, kind: int, payload: bytes = b"") -> None:
        self.pipe.write(HEADER.pack(stream, kind, len(payload)) + payload)
        await self.pipe.drain()

    def pump(self, stream: int, reader: asyncio.StreamReader) -> None:
        """Send what `reader` reads as DATA frames of `stream`, then EOF."""

        async def run() -> None:
            try:
                while data := await reader.read(MAX_FRAME):
                    await self.send(stream, DATA, data)
                await self.send(stream, EOF)
            except (ConnectionError, OSError):
                self.forget(stream)
                with contextlib.suppress(ConnectionError, OSError):
                    await self.send(stream, CLOSE)
                return
            self._sent_eof.add(stream)
            if stream in self._got_eof:
                self.forget(stream)  # done both ways

        task = asyncio.ensure_future(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def deliver(self, stream: int, kind: int, payload: bytes) -> None:
        """A frame from the other side, for one of our streams (unknown ones are gone already: dropped)."""
        writer = self.streams.get(stream)
        if writer is None:
            return
        try:
            if kind == DATA:
                writer.write(payload)  # not drained here: one stream that is not read must not hold up the rest
                if writer.transport.get_write_buffer_size() > STREAM_BUFFER:
                    raise ConnectionResetError("the stream's reader is too far behind")
            elif kind == EOF:
                if writer.can_write_eof():
                    writer.write_eof()
                self._got_eof.add(stream)
                if stream in self._sent_eof:
                    self.forget(stream)  # done both ways
            elif kind == CLOSE:
                self.forget(stream)
        except (ConnectionError, OSError):
            self.forget(stream)
            with contextlib.suppress(ConnectionError, OSError):
                await self.send(stream, CLOSE)

    def forget(self, stream: int) -> None:
        writer = self.streams.pop(stream, None)
        self._sent_eof.discard(stream)
        self._got_eof.discard(stream)
        if writer is not None:
            writer.close()

    async def aclose(self) -> None:
        for stream in list(self.streams):
            self.forget(stream)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def carry(
    frames: asyncio.StreamReader,
    pipe: asyncio.StreamWriter,
    *,
    connect: Callable[[], Awaitable[Stream]],
    hello: asyncio.Event | None = None,
) -> None:
    """The host half: each stream the box opens is connected with `connect()` and spliced to it, until the pipe ends
    (the box's script, and so its container, is gone). `hello` is set once the box's socket listens."""
    ends = _Ends(pipe)
    try:
        async for stream, kind, payload in _frames(frames):
            if kind == HELLO:
                if hello is not None:
                    hello.set()
            elif kind == OPEN:
                try:
                    reader, writer = await connect()
                except OSError:
                    await ends.send(stream, CLOSE)
                    continue
                ends.streams[stream] = writer
                ends.pump(stream, reader)
            else:
                await ends.deliver(stream, kind, payload)
    finally:
        await ends.aclose()


async def _serve(path: str) -> None:
    """The box half: serve the Unix socket at `path`, one stream per connection, over stdin/stdout."""
    loop = asyncio.get_running_loop()
    frames = asyncio.StreamReader(limit=2 * MAX_FRAME)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(frames), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    pipe = asyncio.StreamWriter(transport, protocol, None, loop)
    ends = _Ends(pipe)
    ids = iter(range(1, 2**32))

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = next(ids)
        ends.streams[stream] = writer
        await ends.send(stream, OPEN)
        ends.pump(stream, reader)

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = await asyncio.start_unix_server(accepted, path=path)
    os.chmod(path, 0o600)
    await ends.send(0, HELLO)
    try:
        async for stream, kind, payload in _frames(frames):
            await ends.deliver(stream, kind, payload)
    finally:
        server.close()
        await ends.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="serve a Unix socket's connections as frames on stdin/stdout")
    parser.add_argument("--unix", required=True, help="the socket the box's netbridge forwards the agent's to")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError, ConnectionError):
        asyncio.run(_serve(args.unix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
