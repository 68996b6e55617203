"""A process started before its run is known: the warm half of `LocalSandbox.warm`.

A spare is the sandbox's usual command (bwrap, `docker run`, the bridge) ending in the subreaper shim run with
`--launch-stdin`: it says READY on stdout once everything is up, then waits for the launch on stdin
(`proctree.launch_header`). `until_ready`, `hand_launch` and `put_away` are the three things done to one.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from agents.errors import AgentError
from agents.sandbox import proctree
from agents.specs.spec import AgentLaunch

__all__ = ["SpareFailed", "Started", "hand_launch", "put_away", "until_ready"]

_READY_S = 60.0  # for a spare to be up (a container of a large image can take a while)
_PUT_AWAY_S = 10.0  # for a spare to end once told (EOF); then it is killed


class SpareFailed(AgentError):
    """A warm spare did not come up (the backend's own error, from its stderr)."""


@dataclass(eq=False)
class Started:
    """A process started for one run, and what it holds until it ends (a cgroup, a container)."""

    process: asyncio.subprocess.Process
    held: AsyncExitStack
    made_for: AgentLaunch | None = None  # a warm spare: the template it was started for; it waits for its launch
    limits_hit: dict[str, int] = field(default_factory=dict)  # filled by what it held, as that is released


async def until_ready(spare: Started) -> None:
    """Wait for the spare's shim to say it waits (`proctree.READY`); SpareFailed with its stderr when it does not."""
    stdout, stderr = spare.process.stdout, spare.process.stderr
    assert stdout is not None and stderr is not None
    try:
        async with asyncio.timeout(_READY_S):
            ready = await stdout.read(1)
    except TimeoutError:
        ready = b""
    if ready != proctree.READY:
        if spare.process.returncode is None:
            spare.process.kill()
        detail = b""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                detail = await stderr.read(4096)
        raise SpareFailed(f"the sandbox's process did not start: {detail.decode(errors='replace').strip() or 'no output'}")


async def hand_launch(
    spare: Started, program: list[str], env: dict[str, str], launch: AgentLaunch, *, inherit: tuple[str, ...]
) -> bool:
    """Tell a waiting spare what to run; False when it is gone (it is then put away, and the run starts cold)."""
    stdin = spare.process.stdin
    assert stdin is not None
    header = proctree.launch_header(program, env, str(launch.cwd), stdin=launch.stdin is not None, inherit=inherit)
    try:
        stdin.write(header)
        await stdin.drain()
        if launch.stdin is None:
            stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


async def put_away(started: Started) -> None:
    """End a spare that will run nothing, and release what it held. Its stdin is closed: the shim reads EOF and
    exits, and with it the namespace or container, in order. (A SIGKILL instead could land while bwrap is still
    making its namespaces, before its inner half would die with it.) Killed only when it does not go."""
    process = started.process
    if process.stdin is not None:
        process.stdin.close()  # also: asyncio reports an exit only once every pipe is closed
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), _PUT_AWAY_S)
    except TimeoutError:
        if process.returncode is None:
            proctree.kill_tree(process.pid, include_root=True)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(process.wait()), _PUT_AWAY_S)
    await asyncio.shield(started.held.aclose())
