"""Tasks: what an agent is asked to do, in what workspace, within what limits, and how it is graded.

A task file is JSON Lines, one task per line:

    {"id": "add-2-3",
     "instruction": "What is 2 + 3? Submit it by running: answer <value>",
     "files": {"notes.txt": "text written into the workspace"},          (optional)
     "workspace": "relative/dir/to/copy",                                 (optional, relative to the task file)
     "setup": ["git init -q"],                                            (optional, run in the workspace first)
     "limits": {"wall_s": 300, "idle_s": 120},                            (optional)
     "network": "model",                        (optional: "model", the default, reaches only the model endpoint;
                                                 "open" shares the host's network, e.g. for a set-up that installs)
     "egress": ["pypi.internal:443"],           (optional, with "model": what else the box reaches, by its proxy)
     "image": "name:tag",                       (optional: run the rollout in a container of this image)
     "workdir": "/app",                         (optional, with an image: the workspace is there, seeded from it)
     "grader": {"kind": "answer", "expected": "5", "match": "numeric"},
     "grading": {"where": "fresh", "allow": [], "refuse": [], "tampering": "honest", "stopped": "zero"},
     "stop_rules": [{"name": "no-network", "pattern": "\\bcurl\\b", "tools": ["bash"]}]}   (optional)

Graders (`agents.graders` computes them on the host; the reward never reaches the agent):
- `answer`: the value submitted to the rollout's `answer` tool, matched `exact` (after stripping), by `regex`
  (full match) or `numeric` (within `tolerance`, default 1e-6);
- `command`: a command run in the workspace after the agent exits. With `fail_to_pass` / `pass_to_pass` test ids
  (SWE-Gym style) the command is run with those ids appended and must report every one of them passed (pytest
  `-rA` lines); without them, exit status 0 is reward 1;
- `python`: `"callable": "package.module:function"`, called as `function(task, answer, workspace) -> float`;
- `harbor`: a Harbor task's verifier (`agents.harbor` reads Harbor task directories, which
  `agents.sources.load_tasks` takes besides task files): `tests/test.sh` run with `tests/` at /tests and the reward read from /logs/verifier/reward.{json,txt};
- `swe`: a SWE-Gym / SWE-bench instance (made by `agents.swe.load_swe_tasks`): after the agent exits, its changes
  to the files the hidden `test_patch` touches are reverted (and reported), the patch is applied, and the
  FAIL_TO_PASS and PASS_TO_PASS tests run; 1.0 only when every one of them passes.

Grading (`agents.grading`): the workspace graders see is a fresh box of the task, set up again, with only the
agent's changes that do not change how it is tested (`agents.grading.rules`; `allow` and `refuse` are globs that
let some through or refuse more); each refused change is a `tampering` event, and the reward is the honest grade of
the rest (`"tampering": "zero"`: 0 for a rollout that tampered). `"where": "in_place"` grades in the agent's own box
after it exits, as the graders' own tests do: what it left behind then takes part.

Egress (`agents.sandbox.egress`): the hosts and ports (`host:port`, `host` for 80 and 443, `*.suffix:port`) a box
on the model-only network also reaches, through an HTTP proxy its programs find in HTTP_PROXY / HTTPS_PROXY; every
other destination is refused, each refusal an `egress_refused` event with its destination. Needs an isolating
sandbox (namespace or Docker).

Stop rules: a tool call the policy samples that matches one (a regular expression over its arguments' strings and
the tool's name, for the listed tools or all) is recorded as sampled, and the agent never gets it: the rollout stops
with a `policy_stop` event naming the rule, graded 0 (`grading.stopped: "zero"`) or failed with cause `policy_stop`
(`"drop"`: kept out of training).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import orjson

from agents.errors import AgentConfigError
from agents.sandbox.egress import EgressPolicy
from interceptor.errors import BadRequest
from interceptor.gate.stop_rules import parse_stop_rules

__all__ = ["Grader", "Grading", "Limits", "Task", "TaskError", "load_tasks"]


class TaskError(ValueError):
    """A task file or task is invalid."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    wall_s: float = 600.0  # the whole rollout, agent start to exit
    idle_s: float = 180.0  # no request from the agent for this long: it is stuck (Pi waits forever on a stall)

    def __post_init__(self) -> None:
        if self.wall_s <= 0 or self.idle_s <= 0:
            raise TaskError("limits must be positive")


GraderKind = Literal["answer", "command", "python", "swe", "harbor"]
GRADER_KINDS: tuple[str, ...] = get_args(GraderKind)  # each has its function in `agents.graders.GRADERS`


@dataclass(frozen=True, kw_only=True)
class Grader:
    kind: GraderKind
    expected: str | None = None
    match: Literal["exact", "regex", "numeric"] = "exact"
    tolerance: float = 1e-6
    command: str | None = None
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    timeout_s: float = 300.0
    callable: str | None = None
    # swe: the repository the workspace was made from (test files are restored from it), its commit, and the
    # hidden test patch (never in the workspace while the agent runs)
    repo_path: Path | None = None
    base_commit: str | None = None
    test_patch: str | None = None
    # harbor: the task's verifier directory on the host (shown at /tests only while it runs) and its environment
    tests: Path | None = None
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "answer" and self.expected is None:
            raise TaskError("an answer grader needs 'expected'")
        if self.kind == "answer" and self.match not in ("exact", "regex", "numeric"):
            raise TaskError(f"unknown match {self.match!r}")
        if self.kind == "command" and not self.command:
            raise TaskError("a command grader needs 'command'")
        if self.kind == "python" and (not self.callable or ":" not in self.callable):
            raise TaskError("a python grader needs 'callable': 'module:function'")
        if self.kind == "swe" and not (self.command and self.repo_path and self.base_commit and self.test_patch
                                       and self.fail_to_pass):
            raise TaskError("a swe grader needs command, repo_path, base_commit, test_patch and fail_to_pass")
        if self.kind == "harbor" and (self.tests is None or not (self.tests / "test.sh").is_file()):
            raise TaskError(f"a harbor grader needs 'tests', a directory with test.sh, not {self.tests}")
        if self.kind not in GRADER_KINDS:
            raise TaskError(f"unknown grader kind {self.kind!r}: one of {', '.join(GRADER_KINDS)}")


@dataclass(frozen=True, kw_only=True)
class Grading:
    where: Literal["fresh", "in_place"] = "fresh"
    allow: tuple[str, ...] = ()  # globs of changes that reach grading although a default rule refuses them
    refuse: tuple[str, ...] = ()  # globs refused besides the default rules
    tampering: Literal["honest", "zero"] = "honest"  # the reward of a rollout with refused changes
    stopped: Literal["zero", "drop"] = "zero"  # a rollout a stop rule ended: graded 0, or failed `policy_stop`
    max_change_bytes: int = 64 * 2**20  # the changed files' bytes carried to the fresh box; past it the reward is 0

    def __post_init__(self) -> None:
        if self.where not in ("fresh", "in_place"):
            raise TaskError(f"grading.where must be 'fresh' or 'in_place', not {self.where!r}")
        if self.tampering not in ("honest", "zero"):
            raise TaskError(f"grading.tampering must be 'honest' or 'zero', not {self.tampering!r}")
        if self.stopped not in ("zero", "drop"):
            raise TaskError(f"grading.stopped must be 'zero' or 'drop', not {self.stopped!r}")
        if self.max_change_bytes <= 0:
            raise TaskError("grading.max_change_bytes must be positive")
        for pattern in (*self.allow, *self.refuse):
            if not isinstance(pattern, str) or not pattern:
                raise TaskError(f"grading patterns are non-empty globs, not {pattern!r}")


@dataclass(frozen=True, kw_only=True)
class Task:
    id: str
    instruction: str
    grader: Grader
    files: dict[str, str] = field(default_factory=dict)
    workspace: Path | None = None  # a directory copied into the rollout's workspace
    setup: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    image: str | None = None  # run the rollout in a container of this image (the runner picks DockerSandbox)
    network: Literal["model", "open"] = "model"  # model: only the model endpoint; open: the host's network
    egress: tuple[str, ...] = ()  # with "model": destinations also reached, through the box's proxy
    workdir: str | None = None  # with an image: where the workspace is in the box (seeded from the image's there)
    grading: Grading = field(default_factory=Grading)
    # the gate stops the rollout before its agent runs a sampled tool call one of these matches
    # ({"name", "pattern", "tools"?}: `interceptor.gate.stop_rules`)
    stop_rules: tuple[dict, ...] = ()
    # the Harbor task directory it was read from (`agents.harbor`): what the Harbor driver hands Harbor to run
    harbor_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.id or not self.instruction:
            raise TaskError("a task needs an id and an instruction")
        if self.network not in ("model", "open"):
            raise TaskError(f"task {self.id}: network must be 'model' or 'open', not {self.network!r}")
        if self.workdir is not None and (self.image is None or not self.workdir.startswith("/")):
            raise TaskError(f"task {self.id}: a workdir is an absolute path in the task's image")
        if self.egress and self.network == "open":
            raise TaskError(f"task {self.id}: egress narrows the model-only network; an open one reaches everything")
        try:
            EgressPolicy.parse(self.egress)
        except AgentConfigError as exc:
            raise TaskError(f"task {self.id}: {exc}") from exc
        try:
            parse_stop_rules(list(self.stop_rules))
        except BadRequest as exc:
            raise TaskError(f"task {self.id}: {exc.message}") from exc
        for name in self.files:
            path = Path(name)
            if path.is_absolute() or ".." in path.parts:
                raise TaskError(f"task {self.id}: file {name!r} must stay inside the workspace")

    @classmethod
    def from_dict(cls, data: dict, *, base_dir: Path) -> Task:
        known = {"id", "instruction", "grader", "files", "workspace", "setup", "limits", "image", "workdir", "network",
                 "egress", "grading", "stop_rules"}
        unknown = set(data) - known
        if unknown:
            raise TaskError(f"unknown task fields {sorted(unknown)}")
        grader = dict(data.get("grader") or {})
        for key in ("fail_to_pass", "pass_to_pass"):
            grader[key] = tuple(grader.get(key) or ())
        if "expected" in grader and grader["expected"] is not None:
            grader["expected"] = str(grader["expected"])
        for key in ("repo_path", "tests"):
            if grader.get(key):
                grader[key] = base_dir / grader[key]
        if isinstance(grader.get("env"), dict):
            grader["env"] = tuple(sorted((str(k), str(v)) for k, v in grader["env"].items()))
        grading = dict(data.get("grading") or {})
        for key in ("allow", "refuse"):
            if not isinstance(grading.get(key, []), list):
                raise TaskError(f"grading.{key} is a list of globs")
            grading[key] = tuple(grading.get(key) or ())
        try:
            return cls(
                id=str(data.get("id", "")),
                instruction=str(data.get("instruction", "")),
                grader=Grader(**grader),
                files=dict(data.get("files") or {}),
                workspace=(base_dir / data["workspace"]) if data.get("workspace") else None,
                setup=tuple(data.get("setup") or ()),
                limits=Limits(**(data.get("limits") or {})),
                image=data.get("image"),
                workdir=data.get("workdir"),
                network=data.get("network", "model"),
                egress=_strings(data.get("egress") or [], "egress"),
                grading=Grading(**grading),
                stop_rules=tuple(data.get("stop_rules") or ()),
            )
        except TypeError as exc:  # unknown keys inside grader, limits or grading
            raise TaskError(str(exc)) from exc


def _strings(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TaskError(f"{name} is a list of strings")
    return tuple(value)


def load_tasks(path: Path | str) -> list[Task]:
    """A JSON Lines task file (`agents.sources.load_tasks` also takes a Harbor task directory)."""
    path = Path(path)
    tasks, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            data = orjson.loads(line)
            if not isinstance(data, dict):
                raise TaskError("a task is a JSON object")
            task = Task.from_dict(data, base_dir=path.parent)
        except (orjson.JSONDecodeError, TaskError) as exc:
            raise TaskError(f"{path}:{number}: {exc}") from exc
        if task.id in seen:
            raise TaskError(f"{path}:{number}: duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise TaskError(f"{path} holds no tasks")
    return tasks
