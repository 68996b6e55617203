"""Harbor tasks as a task source: a Harbor task directory (or a dataset, a folder of them) read as `Task`s.

Harbor (PyPI `harbor`) is the format Terminal-Bench 2 and many SWE sets ship in:

    fix-calc/
      task.toml          limits, environment, verifier settings
      instruction.md     what the agent is asked (all of it)
      environment/       the agent's image: a Dockerfile and its build context
      tests/test.sh      the verifier, run after the agent; it writes /logs/verifier/reward.txt (or reward.json)
      solution/          a reference solution (not used here)

Read here, without Harbor itself (Python 3.11's `tomllib`):
- the instruction is `instruction.md`; the task's id is `[task].name` (else the directory's name);
- the image is `[environment].docker_image` when named (it must be on this machine), else `environment/Dockerfile`
  built once into `interceptor/harbor-<name>:<hash of the environment directory>` (a rebuild only when it changes);
- the workspace is the image's WORKDIR (`[environment].workdir` overrides it): the box's files start as the image's
  there (`DockerSandbox(workdir=...)`), and the agent's changes to them are what grading carries;
- `[agent].timeout_sec` is the rollout's wall limit; the verifier is a `harbor` grader (`agents.graders`): `tests/`
  shown at /tests only while it runs, in a fresh box of the task with the agent's allowed changes
  (`agents.grading`), `[verifier].timeout_sec` and `[verifier].env` honoured, the reward read from its file;
- `[environment].network_mode`: "no-network" (and no setting: this project's default) reach only the model,
  "allowlist" adds `allowed_hosts` as an egress list (ports 80 and 443), "public" is the open network.

With `harbor_runs=True` (`--driver harbor`: Harbor runs them, `agents.harbor.driver`) only the id, instruction and
limits are read (a task without a `network_mode` is then public, Harbor's default), no image is built and nothing
below is refused: Harbor honours its own format.

Refused, with the reason (never run differently from what the task says): multi-step tasks (`steps`), a Windows
environment, an environment without a Dockerfile (docker-compose), a separate verifier environment, MCP servers,
GPUs or TPUs, environment variables for the agent's container (`[environment].env`), a verifier or agent that must run
as another user, per-phase network policies, and CIDR ranges in `allowed_hosts`. Resource sizes (`cpus`,
`memory_mb`, `storage_mb`) are not applied per task: the run's own limits apply (`--cpus`, `--memory-mib`); they
are logged once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import tomllib
from pathlib import Path

from agents.tasks import Grader, Limits, Task, TaskError

__all__ = ["build_image", "is_harbor_dataset", "load_harbor_tasks"]

log = logging.getLogger(__name__)

_BUILD_TIMEOUT_S = 600.0  # Harbor's default `build_timeout_sec`
_INSPECT_S = 30.0
_KNOWN = {"schema_version", "version", "task", "metadata", "verifier", "agent", "environment", "solution", "source",
          "artifacts", "multi_step_reward_strategy", "steps"}
_SIZES = ("cpus", "memory_mb", "storage_mb")


def is_harbor_dataset(path: Path) -> bool:
    """A Harbor task directory, or a folder holding some."""
    path = Path(path)
    if not path.is_dir():
        return False
    return (path / "task.toml").is_file() or any((child / "task.toml").is_file() for child in path.iterdir())


def load_harbor_tasks(path: Path | str, *, docker: str = "docker", harbor_runs: bool = False) -> list[Task]:
    """Every task of a Harbor task directory or dataset, its image built where it has to be. `harbor_runs`: Harbor
    itself will run them (`agents.harbor.driver`): only what the runner reads (id, instruction, limits) is taken,
    no image is built here and nothing is refused (Harbor honours its own format)."""
    path = Path(path).resolve()
    if (path / "task.toml").is_file():
        directories = [path]
    else:
        directories = sorted(child for child in path.iterdir() if (child / "task.toml").is_file())
    if not directories:
        raise TaskError(f"{path} holds no Harbor task (a directory with task.toml)")
    tasks, seen, sized = [], set(), []
    for directory in directories:
        try:
            task, sizes = _task(directory, docker=docker, harbor_runs=harbor_runs)
        except TaskError as exc:
            raise TaskError(f"{directory}: {exc}") from exc
        if task.id in seen:
            raise TaskError(f"{directory}: a second task named {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
        if sizes:
            sized.append(task.id)
    if sized:
        log.warning("the resource sizes of %d Harbor task(s) (%s) are not applied per task: the run's limits apply",
                    len(sized), ", ".join(sized[:5]))
    return tasks


def _task(directory: Path, *, docker: str, harbor_runs: bool = False) -> tuple[Task, bool]:
    try:
        config = tomllib.loads((directory / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TaskError(f"task.toml: {exc}") from exc
    if not harbor_runs:
        _refuse_what_cannot_be_honoured(config, directory)
    environment = _table(config, "environment")
    agent, verifier = _table(config, "agent"), _table(config, "verifier")
    instruction_path = directory / "instruction.md"
    if not instruction_path.is_file():
        raise TaskError("no instruction.md")
    instruction = instruction_path.read_text(encoding="utf-8").strip()
    name = str(_table(config, "task").get("name") or directory.name)
    limits = Limits(wall_s=float(agent["timeout_sec"])) if agent.get("timeout_sec") else Limits()
    # Harbor's own default network is the public one; this project's (its runner's) is the model's alone
    network, egress = ("open", ()) if harbor_runs and not _names_network(environment) else _network(environment)
    if harbor_runs:
        grader = Grader(kind="harbor", tests=directory / "tests", timeout_s=float(verifier.get("timeout_sec", 600.0)))
        return Task(id=name, instruction=instruction, limits=limits, harbor_dir=directory.resolve(), grader=grader,
                    network=network, egress=egress), False  # fmt: skip
    image = environment.get("docker_image")
    if image is None:
        image = build_image(directory / "environment", name=name, docker=docker,
                            timeout_s=float(environment.get("build_timeout_sec", _BUILD_TIMEOUT_S)))  # fmt: skip
    workdir = environment.get("workdir") or _image_workdir(docker, str(image))
    if not workdir or workdir == "/":
        raise TaskError(f"image {image} sets no WORKDIR and task.toml no [environment].workdir: the agent's files "
                        f"would be the box's whole root")  # fmt: skip
    tests = directory / "tests"
    env = verifier.get("env") or {}
    if not isinstance(env, dict):
        raise TaskError("[verifier].env is a table of strings")
    task = Task(
        id=name, instruction=instruction, image=str(image), workdir=str(workdir), network=network, egress=egress,
        limits=limits, harbor_dir=directory.resolve(),
        grader=Grader(kind="harbor", tests=tests, timeout_s=float(verifier.get("timeout_sec", 600.0)),
                      env=tuple(sorted((str(k), str(v)) for k, v in env.items()))),
    )  # fmt: skip
    return task, any(key in environment for key in _SIZES)


def _names_network(environment: dict) -> bool:
    return environment.get("network_mode") is not None or environment.get("allow_internet") is not None


def _table(config: dict, name: str) -> dict:
    value = config.get(name) or {}
    if not isinstance(value, dict):
        raise TaskError(f"[{name}] is a table")
    return value


def _refuse_what_cannot_be_honoured(config: dict, directory: Path) -> None:
    environment = _table(config, "environment")
    verifier, agent = _table(config, "verifier"), _table(config, "agent")
    reasons = []
    if unknown := sorted(set(config) - _KNOWN):
        reasons.append(f"unknown tables or keys {unknown}")
    if config.get("steps"):
        reasons.append("multi-step tasks ([[steps]]) are not run here")
    if str(environment.get("os", "linux")).lower() != "linux":
        reasons.append("only Linux environments run here")
    if environment.get("docker_image") is None and not (directory / "environment" / "Dockerfile").is_file():
        reasons.append("the environment has no Dockerfile (docker-compose environments are not run here)")
    if verifier.get("environment_mode") == "separate" or verifier.get("environment"):
        reasons.append("a separate verifier environment is not run here")
    if environment.get("mcp_servers"):
        reasons.append("MCP servers are not started here")
    if environment.get("gpus") or environment.get("gpu_types") or environment.get("tpu"):
        reasons.append("GPU and TPU environments are not run here")
    if environment.get("env"):
        reasons.append("[environment].env is not passed to the agent's container here")
    for table, what in ((verifier, "verifier"), (agent, "agent")):
        if table.get("user") not in (None, ""):
            reasons.append(f"the {what} runs as this host's user here, not as {table['user']!r}")
        if table.get("network_mode") is not None or table.get("allowed_hosts") is not None:
            reasons.append(f"a network policy for the {what} alone is not applied here")
    if not (directory / "tests" / "test.sh").is_file():
        reasons.append("no tests/test.sh (the verifier)")
    if reasons:
        raise TaskError("; ".join(reasons))


def _network(environment: dict) -> tuple[str, tuple[str, ...]]:
    mode = environment.get("network_mode")
    if mode is None and environment.get("allow_internet") is not None:  # Harbor's older spelling
        mode = "public" if environment["allow_internet"] else "no-network"
    if mode in (None, "no-network"):
        return "model", ()
    if mode == "public":
        return "open", ()
    if mode != "allowlist":
        raise TaskError(f"[environment].network_mode {mode!r} is not one of no-network, public, allowlist")
    hosts = environment.get("allowed_hosts") or []
    if not isinstance(hosts, list) or any("/" in str(host) for host in hosts):
        raise TaskError("[environment].allowed_hosts: a list of host names and addresses (CIDR ranges are not "
                        "enforced here)")  # fmt: skip
    return "model", tuple(f"[{h}]" if ":" in str(h) else str(h) for h in hosts)


def build_image(context: Path, *, name: str, docker: str = "docker", timeout_s: float = _BUILD_TIMEOUT_S) -> str:
    """The image of a Harbor environment, built from its Dockerfile unless this content was built already."""
    tag = f"interceptor/harbor-{_slug(name)}:{_digest(context)}"
    if _image_exists(docker, tag):
        return tag
    try:
        built = subprocess.run([docker, "build", "--quiet", "--label", "interceptor.harbor=1", "-t", tag, str(context)],
                               capture_output=True, text=True, timeout=timeout_s, check=False)  # fmt: skip
    except FileNotFoundError as exc:
        raise TaskError(f"building {context}: no docker client ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise TaskError(f"building {context} took over {timeout_s:g}s") from exc
    if built.returncode != 0:
        raise TaskError(f"building {context} failed: {(built.stderr or built.stdout)[-800:]}")
    return tag


def _image_exists(docker: str, image: str) -> bool:
    try:
        done = subprocess.run([docker, "image", "inspect", image], capture_output=True, timeout=_INSPECT_S, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _image_workdir(docker: str, image: str) -> str:
    try:
        done = subprocess.run([docker, "image", "inspect", "--format", "{{.Config.WorkingDir}}", image],
                              capture_output=True, text=True, timeout=_INSPECT_S, check=False)  # fmt: skip
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        raise TaskError(f"image {image} could not be inspected: {exc}") from exc
    if done.returncode != 0:
        raise TaskError(f"image {image} is not on this machine (images are not pulled): {done.stderr.strip()}")
    return done.stdout.strip()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "task"


def _digest(context: Path) -> str:
    """The environment directory's content (paths, modes, bytes): a changed Dockerfile or file is a new image."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for file in sorted(files):
            path = Path(root) / file
            digest.update(f"{path.relative_to(context)}\0{path.lstat().st_mode}\0".encode())
            if path.is_symlink():
                digest.update(os.readlink(path).encode())
            elif path.is_file():
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
