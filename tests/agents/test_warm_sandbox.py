"""Warm sandboxes and the warm pool, with real processes and real namespaces: a run handed to a process started
ahead gets exactly what a cold one gets, keeps the isolation and the limits, and nothing of a spare outlives its
sandbox. (The Docker backend's warm runs are in test_docker_sandbox.py.)"""

from __future__ import annotations

import asyncio
import sys

import pytest

from agents import AgentLaunch, LocalSandbox, LocalSandboxConfig, RunLimits
from agents.errors import AgentConfigError, AgentError
from agents.sandbox.namespace import NamespaceSandbox
from agents.sandbox.pool import PoolConfig, SandboxPool

from .test_isolation import (  # noqa: F401  (model_server and other_listener are fixtures)
    ATTACKS,
    B_SECRET,
    BOUND_S,
    alive,
    attack_from_b,
    host_pids,
    model_server,
    needs_namespaces,
    other_listener,
    wait_until,
)

FAST = LocalSandboxConfig(kill_grace_s=0.5, poll_s=0.05)
SECRET = "warm-secret-6d2a91"
BACKENDS = [
    pytest.param(LocalSandbox, id="local"),
    pytest.param(NamespaceSandbox, id="namespace", marks=needs_namespaces),
]
# What the agent sees of itself: cwd, argv, stdin, and its whole environment (TMPDIR and PATH name the rollout's
# directory, so the report is made relative to it).
REPORT = (
    "import json, os, sys\n"
    "root = os.environ['TMPDIR'].rsplit('/', 1)[0]\n"
    "env = {k: v.replace(root, 'ROOT') for k, v in os.environ.items()}\n"
    "print(json.dumps({'cwd': os.getcwd().replace(root, 'ROOT'), 'argv': sys.argv[1:], 'stdin': sys.stdin.read(),"
    " 'env': env}, sort_keys=True))\n"
)


def make(backend: type, **kwargs) -> LocalSandbox:
    return backend(FAST, **kwargs)


def report_launch(box: LocalSandbox, *, stdin: bytes | None) -> AgentLaunch:
    (box.workspace / "sub").mkdir(exist_ok=True)
    return AgentLaunch(argv=(sys.executable, "-c", REPORT, "one", "two words"), env={"KEY": SECRET, "HOME": str(box.home)},
                       cwd=box.workspace / "sub", stdin=stdin, secrets=(SECRET,))  # fmt: skip


def spare_pid(box: LocalSandbox) -> int:
    assert box.warm_ready
    return box._spare.process.pid  # the one place a test looks inside: which process to watch


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stdin", [b"the instruction\n", None], ids=["stdin", "no-stdin"])
async def test_a_warm_run_gets_the_same_argv_env_cwd_and_stdin_as_a_cold_one(backend, stdin):
    async with asyncio.timeout(BOUND_S):
        async with make(backend) as cold_box:
            cold = await cold_box.run(report_launch(cold_box, stdin=stdin), limits=RunLimits(wall_s=BOUND_S))
        async with make(backend) as warm_box:
            await warm_box.warm()
            warm = await warm_box.run(report_launch(warm_box, stdin=stdin), limits=RunLimits(wall_s=BOUND_S))
            assert warm_box.warm_starts == 1
    assert cold.ok and warm.ok, (cold, warm)
    assert warm.stdout == cold.stdout
    assert '"KEY": "***"' in warm.stdout and '"stdin": "' + (stdin or b"").decode().replace("\n", "\\n") in warm.stdout


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_warm_sandbox_stays_warm_for_every_run_and_its_exit_codes_are_kept(backend):
    async with asyncio.timeout(BOUND_S), make(backend) as box:
        await box.warm()
        results = [await box.exec(f"echo run {i}; exit {i}", timeout_s=BOUND_S) for i in range(3)]
        assert box.warm_starts == 3
    assert [(r.exit_code, r.output) for r in results] == [(i, f"run {i}\n") for i in range(3)]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_putting_a_warm_sandbox_away_ends_its_spare(backend):
    async with asyncio.timeout(BOUND_S):
        async with make(backend) as box:
            await box.warm()
            first = spare_pid(box)
            await box.exec("true", timeout_s=BOUND_S)
            assert await wait_until(lambda: box.warm_ready, within_s=20), "no spare after the run"
            second = spare_pid(box)
        assert first != second
        assert await wait_until(lambda: not alive(first) and not alive(second), within_s=20)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_warm_run_that_times_out_ends_its_whole_tree(backend):
    marker = "301.424242"
    script = f"setsid sleep {marker} & sleep 300"
    async with asyncio.timeout(BOUND_S), make(backend) as box:
        await box.warm()
        result = await box.run(AgentLaunch(argv=("sh", "-c", script), env={}, cwd=box.workspace),
                               limits=RunLimits(wall_s=1.0, idle_s=None))  # fmt: skip
        assert box.warm_starts == 1
    assert result.outcome == "timeout"
    argv = f"sleep\0{marker}\0".encode()
    assert await wait_until(lambda: not host_pids(lambda cmdline, environ: cmdline == argv), within_s=10)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_warm_launch_puts_its_secret_in_no_argv(backend):
    async with asyncio.timeout(BOUND_S), make(backend) as box:
        await box.warm()
        launch = AgentLaunch(argv=("sh", "-c", "echo up > ready; exec sleep 300"), env={"KEY": SECRET},
                             cwd=box.workspace, secrets=(SECRET,))  # fmt: skip
        stop = asyncio.Event()
        run = asyncio.create_task(box.run(launch, limits=RunLimits(wall_s=BOUND_S, idle_s=None), stop=stop))
        try:
            assert await wait_until((box.workspace / "ready").exists, within_s=20)
            assert host_pids(lambda cmdline, environ: SECRET.encode() in cmdline) == []
            assert host_pids(lambda cmdline, environ: SECRET.encode() in environ) != []  # and yet the agent has it
        finally:
            stop.set()
            assert (await run).outcome == "cancelled"


@needs_namespaces
async def test_a_spare_made_for_another_endpoint_is_put_away_and_the_run_starts_cold(model_server):
    script = "import os, urllib.request; print(urllib.request.urlopen(os.environ['OPENAI_BASE_URL'] + '/models').read())"
    async with asyncio.timeout(BOUND_S), make(NamespaceSandbox) as box:  # no endpoint: the spare has no bridge
        await box.warm()
        spare = spare_pid(box)
        launch = AgentLaunch(argv=(sys.executable, "-c", script), env={"OPENAI_BASE_URL": model_server.base_url()},
                             cwd=box.workspace)  # fmt: skip
        result = await box.run(launch, limits=RunLimits(wall_s=BOUND_S))
        assert box.warm_starts == 0
        assert not alive(spare)
    assert result.ok and "policy" in result.stdout, result


@needs_namespaces
async def test_a_warm_namespace_sandbox_blocks_every_attack_of_another_rollout(model_server, other_listener):
    async with asyncio.timeout(BOUND_S):
        succeeded, out = await attack_from_b(NamespaceSandbox, model_server, other_listener, warm_b=True)
    assert succeeded == dict.fromkeys(ATTACKS, False)
    assert '"id": "policy"' in out
    assert model_server.authorizations == [f"Bearer {B_SECRET}"]


# ------------------------------------------------------------------------------------------------ the pool


class Counting:
    """A sandbox factory that counts what it made, and can be told to fail."""

    def __init__(self, backend: type = LocalSandbox) -> None:
        self.backend = backend
        self.made: list[LocalSandbox] = []
        self.fail: str | None = None

    def __call__(self) -> LocalSandbox:
        if self.fail is not None:
            raise AgentError(self.fail)
        box = make(self.backend)
        self.made.append(box)
        return box


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_pool_hands_out_prepared_sandboxes_and_makes_their_replacements(backend):
    factory = Counting(backend)
    async with asyncio.timeout(BOUND_S), SandboxPool(PoolConfig(size=2)) as pool:
        await pool.prefill("k", factory)
        assert await wait_until(lambda: pool.ready("k") == 2, within_s=20)
        async with pool.sandbox("k", factory) as box:
            assert box.warm_ready  # its first process is already up
            result = await box.exec("echo hi", timeout_s=BOUND_S)
            assert box.warm_starts == 1
        assert result.output == "hi\n"
        assert await wait_until(lambda: pool.ready("k") == 2, within_s=20)
        assert (pool.taken_warm, pool.taken_cold, len(factory.made)) == (1, 0, 3)
        roots = [box.root for box in factory.made[1:]]
    assert not any(root.exists() for root in roots)  # the prepared ones are put away with the pool
    assert not factory.made[0]._root


async def test_an_empty_pool_makes_a_sandbox_on_demand_and_every_sandbox_serves_one_rollout():
    factory = Counting()
    async with asyncio.timeout(BOUND_S), SandboxPool(PoolConfig(size=1)) as pool:
        async with pool.sandbox("k", factory) as first:
            (first.workspace / "left-behind").write_text("x")
        async with pool.sandbox("k", factory) as second:
            assert not (second.workspace / "left-behind").exists()
    assert pool.taken_cold >= 1 and len({id(box) for box in factory.made}) == len(factory.made)


async def test_the_pool_keeps_only_the_most_recent_kinds_warm():
    factories = {kind: Counting() for kind in "abc"}
    async with asyncio.timeout(BOUND_S), SandboxPool(PoolConfig(size=1, kinds=2)) as pool:
        for kind, factory in factories.items():
            await pool.prefill(kind, factory)
            assert await wait_until(lambda kind=kind: pool.ready(kind) == 1, within_s=20)
        assert pool.ready("a") == 0 and pool.ready("b") == 1 and pool.ready("c") == 1
        assert factories["a"].made[0]._root is None  # put away, not leaked


async def test_a_kind_that_cannot_be_made_stops_refilling_and_the_caller_gets_the_error():
    factory = Counting()
    factory.fail = "bwrap refused"
    async with asyncio.timeout(BOUND_S), SandboxPool(PoolConfig(size=2)) as pool:
        await pool.prefill("k", factory)
        await asyncio.sleep(0.2)
        assert pool.ready("k") == 0
        with pytest.raises(AgentError, match="bwrap refused"):
            async with pool.sandbox("k", factory):
                pass
        factory.fail = None  # the backend is back: the next rollout is made on demand and the pool refills
        async with pool.sandbox("k", factory) as box:
            assert (await box.exec("true", timeout_s=BOUND_S)).ok
        assert await wait_until(lambda: pool.ready("k") == 2, within_s=20)


def test_a_negative_pool_size_is_refused():
    with pytest.raises(AgentConfigError):
        PoolConfig(size=-1)


async def test_a_spare_that_does_not_come_up_is_an_error_with_its_stderr_and_leaves_nothing():
    class Broken(LocalSandbox):
        def _launcher(self) -> list[str]:
            return ["/bin/sh", "-c", "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1"]

    from agents.sandbox.spare import SpareFailed

    async with asyncio.timeout(BOUND_S), Broken(FAST) as box:
        with pytest.raises(SpareFailed, match="uid map: Permission denied"):
            await box.warm()
        assert not box.warm_ready
        assert (await box.exec("echo cold", timeout_s=BOUND_S)).output == "cold\n"  # a run still starts, cold
        assert box.warm_starts == 0
