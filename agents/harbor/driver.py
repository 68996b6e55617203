"""Harbor as the rollout driver: each rollout is one Harbor trial whose agent's model endpoint is the rollout.

    driver = HarborDriver(HarborConfig(agent="pi"))
    runner = Runner(server, RunnerConfig(agent=..., driver=driver))     # `interceptor run --driver harbor`

Harbor runs the trial as it always does (its environment, its installed agent, its verifier); Interceptor gives the
agent its rollout's URL and secret as the model's base URL and key, so every model call is a turn of the rollout,
token-exact, and Harbor's verifier result becomes the rollout's reward. Harbor's own failures become failure causes
(`trials.read_outcome`), never rewards.

Per trial, with Harbor's Docker environment: a network of the trial's own (`network.TrialNetwork`), the server's box
port listening on its gateway (the rollout routes alone), the box's main service put on that network by a compose
override, and the agent mounted from this host's box installs (`box_agents`) with Harbor's installer skipped. With a
remote environment (Daytona, Modal, E2B, ...), the box is given the server's `--box-listen` address (`--box-url` when
boxes see it under another name) and Harbor's network settings are the environment's.

Harbor needs Python >= 3.12; this project runs on 3.11. Harbor runs as its own program, from the virtual environment
`scripts/setup-harbor.sh` makes (`INTERCEPTOR_HARBOR` names another `harbor` program). Its environment gets PATH,
HOME, the locale, Docker's client settings, a remote environment's credentials (`_CREDENTIALS`, and `pass_env`) and
the rollout's key: nothing else of this process's (no admin token).
Harbor's verifier runs in the agent's own box after it (Harbor's contract): the fresh-box grading of Interceptor's
own runner does not apply to trials Harbor drives.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import tomllib
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from agents.errors import AgentConfigError, AgentError, RolloutFailed
from agents.harbor.box_agents import box_agent
from agents.harbor.network import TrialNetwork, has_default_bridge
from agents.harbor.trials import KEY_VARIABLE, TrialOutcome, read_outcome, trial_config

if TYPE_CHECKING:
    from interceptor.server import InterceptionServer, RolloutHandle

    from agents.tasks import Task

__all__ = ["HarborConfig", "HarborDriver", "harbor_program"]

_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG",
               "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")  # fmt: skip
# A remote environment's credentials, passed to Harbor when set (HOME is too: `hf auth login`, ~/.modal.toml)
_CREDENTIALS = {
    "daytona": ("DAYTONA_API_KEY", "DAYTONA_API_URL", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID", "DAYTONA_TARGET"),
    "modal": ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_ENVIRONMENT"),
    "hf-sandbox": ("HF_TOKEN", "HF_ENDPOINT"),
    "e2b": ("E2B_API_KEY",),
    "runloop": ("RUNLOOP_API_KEY",),
}
# Harbor's Docker environment on the trial network (`harbor_side/interceptor_docker.py`), loaded by Harbor itself
_PLUGIN_DIR = Path(__file__).resolve().parent / "harbor_side"
PLUGIN = "interceptor_docker:InterceptorDockerEnvironment"
MODEL_HOST = "INTERCEPTOR_MODEL_HOST"
_LOG_KEPT = 1500  # bytes of Harbor's output kept in the failure of a trial that wrote no result
_END_GRACE_S = 30.0  # a Harbor ended early (a stop rule, a hang, Ctrl-C) gets this long to take its trial down


def harbor_program() -> Path | None:
    """`INTERCEPTOR_HARBOR`, else the venv scripts/setup-harbor.sh makes, else `harbor` on PATH."""
    if configured := os.environ.get("INTERCEPTOR_HARBOR"):
        return Path(configured)
    made = Path.home() / ".cache" / "interceptor" / "harbor" / "venv" / "bin" / "harbor"
    if made.is_file():
        return made
    found = shutil.which("harbor")
    return Path(found) if found else None


@dataclass(frozen=True, kw_only=True)
class HarborConfig:
    agent: str = "pi"  # Harbor's agent name
    environment: str = "docker"  # Harbor's environment type (docker here; a remote one needs the server's box_listen)
    install: Literal["box", "harbor"] = "box"  # box: this host's install mounted in; harbor: Harbor's installer
    api_format: str | None = None  # as Harbor names it; None: the box agent's own (Pi: chat completions)
    agent_kwargs: tuple[tuple[str, str], ...] = ()  # Harbor's `--agent-kwarg`s
    environment_kwargs: tuple[tuple[str, str], ...] = ()  # Harbor's `--environment-kwarg`s (a remote one's flavor)
    pass_env: tuple[str, ...] = ()  # more of this process's variables Harbor gets (besides the environment's own)
    harbor: Path | None = None  # the `harbor` program (default: `harbor_program()`)
    trials_dir: Path | None = None  # keep Harbor's trial directories here; None: each is removed after its rollout
    setup_timeout_s: float | None = None  # the agent's set-up (its install) past this fails the trial; None: Harbor's
    docker: str = "docker"
    slack_s: float = 900.0  # past the task's agent and verifier limits, the Harbor process is ended (image builds)

    def __post_init__(self) -> None:
        if self.install not in ("box", "harbor"):
            raise AgentConfigError(f"install is 'box' or 'harbor', not {self.install!r}")
        if self.install == "box" and self.environment != "docker":
            raise AgentConfigError(f"a {self.environment!r} box cannot mount this host's agent installs: use Harbor's "
                                   f"installer (install 'harbor'), or an image that carries the agent (agent kwarg "
                                   f"skip_install=true, with install 'harbor')")  # fmt: skip
        if self.install == "box":
            box_agent(self.agent)  # refuses an agent with no box install, saying which have one
        elif self.api_format is None:
            raise AgentConfigError("with Harbor's own installer, give the agent's api_format (as Harbor names it)")
        if self.slack_s <= 0 or (self.setup_timeout_s is not None and self.setup_timeout_s <= 0):
            raise AgentConfigError("slack_s and setup_timeout_s must be positive")


class HarborDriver:
    def __init__(self, config: HarborConfig) -> None:
        self.config = config
        program = config.harbor or harbor_program()
        if program is None or not os.access(program, os.X_OK):
            raise AgentConfigError(f"Harbor is not installed ({program or 'no harbor program found'}): run "
                                   f"scripts/setup-harbor.sh, or name a `harbor` program in INTERCEPTOR_HARBOR")  # fmt: skip
        self.program = program
        self.name = f"harbor:{config.agent}"  # the records' agent
        self._builds_offline: bool | None = None  # the daemon has no default bridge (found on the first trial)
        self._mounts = box_agent(config.agent).mounts() if config.install == "box" else []

    def check(self, server: InterceptionServer, tasks: list[Task]) -> None:
        """Refuse what this driver cannot run, before any rollout starts."""
        if self.config.environment != "docker" and server.box_port.url is None:
            raise AgentConfigError(f"Harbor's {self.config.environment!r} boxes are not on this host: start the server "
                                   f"with box_listen (--box-listen HOST:PORT, and --box-url if boxes see another "
                                   f"address) so they have an address to reach")  # fmt: skip
        if self.config.environment == "docker" and (listed := [task.id for task in tasks if task.egress]):
            raise AgentConfigError(f"an allow-list of hosts besides the model is not honoured on a Harbor trial's "
                                   f"network here: {', '.join(listed[:5])}")  # fmt: skip
        if not_harbor := [task.id for task in tasks if task.harbor_dir is None]:
            raise AgentConfigError(f"the Harbor driver runs Harbor tasks (directories with task.toml); not: "
                                   f"{', '.join(not_harbor[:5])}")  # fmt: skip

    async def attempt(self, server: InterceptionServer, task: Task, handle: RolloutHandle) -> tuple[float, str]:
        if task.harbor_dir is None:
            raise RolloutFailed("sandbox", f"task {task.id} is not a Harbor task directory")
        rollout = server.rollout(handle.id)
        async with AsyncExitStack() as stack:
            work = Path(tempfile.mkdtemp(prefix="interceptor-harbor-"))
            stack.callback(shutil.rmtree, work, ignore_errors=True)
            extra: tuple[Path, ...] = ()
            env = {KEY_VARIABLE: handle.secret}
            environment: dict = {"type": self.config.environment, "kwargs": dict(self.config.environment_kwargs)}
            if self.config.environment == "docker":
                closed = task.network == "model"  # no-network: the trial network is internal, the plug-in applies it
                try:
                    network = await stack.enter_async_context(TrialNetwork(
                        f"interceptor-trial-{handle.id}", internal=closed, docker=self.config.docker))
                except AgentError as exc:
                    raise RolloutFailed("sandbox", f"the trial's network could not be made: {exc}") from exc
                box_url = await server.box_port.expose(network.gateway)
                stack.push_async_callback(server.box_port.withdraw, network.gateway)
                if self._builds_offline is None:
                    self._builds_offline = not await has_default_bridge(self.config.docker)
                extra = (network.compose_override(work, build_offline=self._builds_offline and _builds(task.harbor_dir)),)
                if closed:
                    environment = {**environment, "type": None, "import_path": PLUGIN}
                    env |= {"PYTHONPATH": str(_PLUGIN_DIR), MODEL_HOST: network.gateway}
            else:
                box_url = server.box_port.url
            trials_dir = self.config.trials_dir or work / "trials"
            agent = box_agent(self.config.agent) if self.config.install == "box" else None
            api_format = self.config.api_format or agent.api_format
            config = trial_config(
                task_dir=task.harbor_dir, trials_dir=trials_dir, trial_name=handle.id, agent=self.config.agent,
                model=server.config.served_model_name, base_url=_base_url(box_url, handle.id, api_format),
                api_format=api_format, environment=environment,
                skip_install=agent is not None, mounts=self._mounts, extra_compose=extra,
                agent_env={"PATH": agent.path()} if agent else None, agent_kwargs=dict(self.config.agent_kwargs),
                setup_timeout_s=self.config.setup_timeout_s,
            )  # fmt: skip
            (work / "trial.json").write_text(json.dumps(config, indent=1))
            limit_s = task.limits.wall_s + task.grader.timeout_s + self.config.slack_s
            ended = await self._run(work, env, limit_s, rollout.stop_requested)
            if ended == "stopped":
                hit = rollout.stopped
                message = f"stopped by rule {hit.rule!r} before the agent ran {hit.tool} {hit.arguments[:200]}"
                if task.grading.stopped == "drop":
                    raise RolloutFailed("policy_stop", message)
                return 0.0, message
            if ended == "hung":
                raise RolloutFailed("timeout", f"the Harbor trial ran past {limit_s:.0f} s and was ended")
            outcome = read_outcome(trials_dir / handle.id)
            if outcome.cause is not None and outcome.exception_type is None:  # Harbor ended before its trial did
                tail = (work / "harbor.log").read_bytes()[-_LOG_KEPT:].decode(errors="replace").strip()
                outcome = replace(outcome, message=f"{outcome.message}; Harbor said: {tail}")
        rollout.note("harbor_trial", agent=self.config.agent, environment=self.config.environment,
                     phases=outcome.phases, exception=outcome.exception_type)  # fmt: skip
        return _graded(outcome, rollout.trailing_upstream_failures)

    async def _run(self, work: Path, extra_env: dict[str, str], limit_s: float, stop: asyncio.Event) -> str:
        """Run `harbor trial start`: "done", "stopped" (a stop rule matched) or "hung" (past `limit_s`)."""
        passed = (*_PASSED_ENV, *_CREDENTIALS.get(self.config.environment, ()), *self.config.pass_env)
        env = {name: os.environ[name] for name in passed if name in os.environ}
        env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1", **extra_env}
        with open(work / "harbor.log", "wb") as log:
            process = await asyncio.create_subprocess_exec(
                str(self.program), "trial", "start", "-c", str(work / "trial.json"), cwd=work, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)  # fmt: skip
        waiting = asyncio.ensure_future(process.wait())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({waiting, stopping}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if process.returncode is None:
                await asyncio.shield(_end(process))
        if waiting in done:
            return "done"
        return "stopped" if stop.is_set() else "hung"


async def _end(process: asyncio.subprocess.Process) -> None:
    """SIGINT to Harbor's process group (it takes the trial down), then SIGKILL past the grace."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            async with asyncio.timeout(_END_GRACE_S):
                await process.wait()
            return
        except TimeoutError:
            continue


def _base_url(box_url: str, rollout_id: str, api_format: str) -> str:
    """The rollout's base URL as the agent's SDK wants it: Anthropic's adds /v1 itself, OpenAI's wants it given."""
    root = f"{box_url}/rollout/{rollout_id}"
    return root if api_format == "anthropic_messages" else f"{root}/v1"


def _builds(task_dir: Path) -> bool:
    """Whether Harbor builds the task's image (a Dockerfile and no `[environment].docker_image`)."""
    try:
        environment = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8")).get("environment") or {}
    except (OSError, tomllib.TOMLDecodeError):
        return False  # Harbor reports the task file's fault itself
    return (task_dir / "environment" / "Dockerfile").is_file() and not environment.get("docker_image")


def _graded(outcome: TrialOutcome, trailing_upstream_failures: int) -> tuple[float, str]:
    if outcome.cause is not None:
        cause = "upstream" if outcome.cause == "agent" and trailing_upstream_failures else outcome.cause
        raise RolloutFailed(cause, outcome.message)
    if trailing_upstream_failures:  # the agent ended on a failed model call: its work is not the policy's
        raise RolloutFailed("upstream", f"the agent's last {trailing_upstream_failures} chat call(s) failed upstream")
    assert outcome.reward is not None
    return outcome.reward, f"Harbor's verifier: reward {outcome.reward:g}"
