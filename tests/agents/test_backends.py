"""The one table of sandbox backends and the one choice every caller makes from it (`agents.sandbox.backends`):
every registered backend this machine has runs a command in its box; `auto` sends a task with an image to Docker
and the rest to namespaces; a backend named by the user is used for every task; a choice that cannot be honoured
(an unknown name, limits without isolation, a custom sandbox beside a named backend) is refused before a box is
made."""

from __future__ import annotations

import pytest

from agents.errors import AgentConfigError
from agents.runner import RunnerConfig
from agents.sandbox import backends
from agents.sandbox.backends import BACKENDS, CHOICES, BoxChooser, Placement
from agents.sandbox.base import LocalSandbox
from agents.sandbox.cgroups import ResourceLimits
from agents.sandbox.namespace import namespaces_unavailable
from agents.specs.command import CommandAgent
from agents.specs.spec import BoxFile

IMAGE = "interceptor/debian-python:bookworm"  # python3 in a minimal Debian root: scripts/setup-docker.sh
AGENT = CommandAgent(argv=("true",))


def _why_not(name: str) -> str | None:
    if (reason := BACKENDS[name].unavailable()) is not None:
        return reason
    if name.startswith("docker"):
        import subprocess

        done = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=20, check=False)
        return None if done.returncode == 0 else f"image {IMAGE} is missing: run scripts/setup-docker.sh"
    return None


@pytest.mark.parametrize("name", sorted(BACKENDS))
async def test_every_registered_backend_runs_a_command_in_a_box_of_its_own(name, monkeypatch):
    if (reason := _why_not(name)) is not None:
        pytest.skip(f"{name} backend: {reason}")
    if name.startswith("docker"):
        monkeypatch.setattr(backends, "_daemon_elsewhere", lambda: name == "docker-remote")
    choice, image = ("auto", IMAGE) if name.startswith("docker") else (name, None)
    key, make = BoxChooser(choice, Placement())(image, "model")
    assert key == (name, image, "model")
    async with make() as box:
        await box.put_files((BoxFile(box.workspace / "seen.txt", b"from the host\n", 0o644),))
        result = await box.exec("cat seen.txt && echo made-here > made.txt", timeout_s=60)
        assert result.exit_code == 0, result
        assert "from the host" in result.output
        await box.pull_workspace()
        assert (box.workspace / "made.txt").read_text() == "made-here\n"


@pytest.mark.parametrize(("docker_host", "backend"), [("tcp://10.0.0.5:2376", "docker-remote"),
                                                       ("ssh://builder@gpu-7", "docker-remote"),
                                                       ("unix:///var/run/docker.sock", "docker"), ("", "docker")])
def test_a_daemon_on_another_machine_gets_the_backend_that_binds_nothing(monkeypatch, docker_host, backend):
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    assert BoxChooser("auto", Placement())(IMAGE, "model")[0] == (backend, IMAGE, "model")


def test_auto_sends_a_task_with_an_image_to_docker_and_every_other_to_the_default(monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    choose = BoxChooser("auto", Placement())
    default = "namespace" if namespaces_unavailable() is None else "local"
    assert choose(IMAGE, "model")[0] == ("docker", IMAGE, "model")
    assert choose(None, "open")[0] == (default, None, "open")
    assert choose()[0] == (default, None, "model")


@pytest.mark.parametrize("name", [choice for choice in CHOICES if choice != "auto"])
def test_a_backend_the_user_names_runs_every_task_its_image_unused(name):
    if (reason := BACKENDS[name].unavailable()) is not None:
        with pytest.raises(AgentConfigError, match=f"sandbox {name}: "):
            BoxChooser(name, Placement())
        return
    assert BoxChooser(name, Placement())(IMAGE, "model")[0] == (name, None, "model")


def test_choices_that_cannot_be_honoured_are_refused_before_any_box_is_made():
    with pytest.raises(AgentConfigError, match="sandbox must be one of auto, namespace, local, not 'vm'"):
        BoxChooser("vm", Placement())
    with pytest.raises(AgentConfigError, match="resource limits need an isolating sandbox, not local"):
        BoxChooser("local", Placement(resources=ResourceLimits(pids=64)))
    with pytest.raises(AgentConfigError, match="backend must be one of"):
        RunnerConfig(agent=AGENT, backend="vm")
    with pytest.raises(AgentConfigError, match="a custom sandbox runs every task"):
        RunnerConfig(agent=AGENT, sandbox=LocalSandbox, backend="namespace")
