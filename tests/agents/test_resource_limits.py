"""Per-run resource limits of the namespace sandbox (a cgroup per run): memory and process limits hold for the
whole tree, the group is gone afterwards, and a machine that cannot set them refuses them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents import AgentLaunch, RunLimits
from agents.errors import AgentConfigError
from agents.sandbox.cgroups import Cgroup, ResourceLimits, cgroups_unavailable
from agents.sandbox.namespace import NamespaceSandbox, namespaces_unavailable

WHY_NOT = namespaces_unavailable() or cgroups_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"resource limits: {WHY_NOT}")

LIMITS = RunLimits(wall_s=60, idle_s=None)


@pytest.fixture
def made_groups(monkeypatch) -> list[Path]:
    """The cgroup directories this test's runs made (other processes on the machine make and remove their own)."""
    made: list[Path] = []
    create = Cgroup.create.__func__

    def recording(cls, limits: ResourceLimits) -> Cgroup:
        group = create(cls, limits)
        made.extend(group.directories)
        return group

    monkeypatch.setattr(Cgroup, "create", classmethod(recording))
    return made


async def _run(box, script: str):
    return await box.run(AgentLaunch(argv=(sys.executable, "-c", script), env={}, cwd=box.workspace), limits=LIMITS)


async def test_a_run_that_allocates_past_its_memory_limit_is_killed(made_groups):
    async with NamespaceSandbox(resources=ResourceLimits(memory_bytes=96 * 2**20)) as box:
        small = await _run(box, "b = bytearray(16 * 2**20); print('ok')")
        big = await _run(box, "b = bytearray(512 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('survived')")
    assert small.ok and "ok" in small.stdout
    assert "survived" not in big.stdout and big.exit_code != 0
    assert len(made_groups) >= 2 and not any(path.exists() for path in made_groups)  # each run's group was removed


async def test_a_run_cannot_start_more_processes_than_its_pids_limit():
    script = (
        "import subprocess\nstarted = 0\nprocs = []\n"
        "for _ in range(64):\n"
        "    try:\n        procs.append(subprocess.Popen(['sleep', '5'])); started += 1\n"
        "    except OSError:\n        break\n"
        "print(started)\n"
        "for p in procs: p.kill()\n"
    )
    async with NamespaceSandbox(resources=ResourceLimits(pids=24)) as box:
        limited = await _run(box, script)
    async with NamespaceSandbox() as box:
        unlimited = await _run(box, script)
    assert int(limited.stdout.split()[-1]) < 24 <= int(unlimited.stdout.split()[-1])


def test_limits_that_cannot_be_set_are_refused_not_dropped(monkeypatch):
    import agents.sandbox.namespace as module

    monkeypatch.setattr(module, "cgroups_unavailable", lambda: "no controllers here")
    with pytest.raises(AgentConfigError, match="no controllers here"):
        NamespaceSandbox(resources=ResourceLimits(memory_bytes=2**30))
