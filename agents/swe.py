"""SWE tasks: SWE-Gym / SWE-bench instances as tasks, from repositories on this machine (nothing is fetched).

    tasks = load_swe_tasks("instances.jsonl", repos=Path("repos"))     # repos/<owner>__<name>/ are git repositories

An instance (one JSON object per line) has `instance_id`, `repo` ("owner/name"), `base_commit`,
`problem_statement`, `test_patch`, `FAIL_TO_PASS` and `PASS_TO_PASS` (lists of test ids, or those lists encoded
as JSON strings, as the published datasets store them), and optionally `image` and the gold `patch` (never used).

The workspace is the repository's tree at `base_commit` (exported once into `cache`, then copied into each
rollout's sandbox) in a fresh git repository with that one commit, made inside the sandbox: no history (it
could hold the fix), no remote. The hidden `test_patch` stays on the host until grading. Grading
(`agents.graders`, kind `swe`): the files the test patch touches are restored from the original repository at
`base_commit` (the agent's edits to them are reverted and reported), the patch is applied, and the listed tests
run with `test_command`: reward 1.0 only when every FAIL_TO_PASS and PASS_TO_PASS test passes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from agents.tasks import Grader, Limits, Task, TaskError

__all__ = ["DEFAULT_TEST_COMMAND", "apply_patch", "load_swe_tasks", "patch_paths", "restore_test_files"]

DEFAULT_TEST_COMMAND = f"{shlex.quote(sys.executable)} -m pytest -rA -q -p no:cacheprovider"
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_INSTRUCTION = (
    "{problem}\n\nThe repository is in the current directory. Change its code so that this issue is resolved. "
    "Do not change the tests."
)


def load_swe_tasks(
    path: Path | str,
    *,
    repos: Path | str,
    test_command: str = DEFAULT_TEST_COMMAND,
    limits: Limits | None = None,
    cache: Path | str | None = None,
) -> list[Task]:
    """Tasks for the instances in `path`; `cache` (default ~/.cache/interceptor/swe) keeps each base tree."""
    path, repos = Path(path), Path(repos)
    cache = Path(cache) if cache is not None else Path.home() / ".cache" / "interceptor" / "swe"
    tasks = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(_task(orjson.loads(line), repos, test_command, limits or Limits(), cache))
        except (orjson.JSONDecodeError, TaskError, KeyError, TypeError) as exc:
            raise TaskError(f"{path}:{number}: {exc!r}"[:500]) from exc
    if not tasks:
        raise TaskError(f"{path} holds no instances")
    return tasks


def _task(data: dict, repos: Path, test_command: str, limits: Limits, cache: Path) -> Task:
    if not isinstance(data, dict):
        raise TaskError("an instance is a JSON object")
    instance_id, repo, base = str(data["instance_id"]), str(data["repo"]), str(data["base_commit"])
    checkout = repos / repo.replace("/", "__")
    if not (checkout / ".git").exists():
        raise TaskError(f"{instance_id}: no git repository for {repo} at {checkout}")
    if _git(checkout, "cat-file", "-t", base, check=False).strip() != "commit":
        raise TaskError(f"{instance_id}: {checkout} has no commit {base}")
    test_patch = str(data["test_patch"])
    if not patch_paths(test_patch):
        raise TaskError(f"{instance_id}: test_patch touches no file")
    tree = _export(checkout, base, cache / f"{instance_id}-{base[:12]}")
    return Task(
        id=instance_id,
        instruction=_INSTRUCTION.format(problem=str(data["problem_statement"]).strip()),
        grader=Grader(
            kind="swe",
            command=test_command,
            fail_to_pass=_tests(data["FAIL_TO_PASS"]),
            pass_to_pass=_tests(data.get("PASS_TO_PASS") or []),
            repo_path=checkout.resolve(),
            base_commit=base,
            test_patch=test_patch,
        ),
        workspace=tree,
        setup=(
            "git init -q && git add -A && "
            "git -c user.name=interceptor -c user.email=interceptor@localhost commit -q -m base",
        ),
        limits=limits,
        image=data.get("image"),
    )


def _export(checkout: Path, commit: str, tree: Path) -> Path:
    """The files of `commit`, written once into `tree` (built beside it and renamed, so a half-written tree is
    never used)."""
    if tree.is_dir():
        return tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tree.parent, prefix=f".{tree.name}-") as work:
        archive = subprocess.run(["git", "-C", str(checkout), "archive", "--format=tar", commit], capture_output=True)
        if archive.returncode != 0:
            raise TaskError(f"git archive {commit} failed in {checkout}: {archive.stderr[:300]!r}")
        subprocess.run(["tar", "-x", "-C", work], input=archive.stdout, check=True, capture_output=True)
        try:
            os.rename(work, tree)
        except OSError:  # another process exported it meanwhile
            if not tree.is_dir():
                raise
        else:
            os.mkdir(work)  # for TemporaryDirectory's clean-up, which expects it
    return tree


def _tests(value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # the published datasets store the lists as JSON text
        value = orjson.loads(value)
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise TaskError("FAIL_TO_PASS and PASS_TO_PASS must be lists of test ids")
    return tuple(value)


def patch_paths(patch: str) -> list[str]:
    """The files a unified git diff touches (both sides of a rename)."""
    paths: list[str] = []
    for a, b in _DIFF_HEADER.findall(patch):
        paths += [p for p in (a, b) if p not in paths]
    return paths


def restore_test_files(grader: Grader, workspace: Path) -> list[str]:
    """Put every file the test patch touches back as it was at the base commit (absent if it did not exist);
    returns the ones the agent had changed."""
    reverted = []
    for name in patch_paths(grader.test_patch):
        target = workspace / name
        if not target.resolve().is_relative_to(workspace.resolve()):
            raise ValueError(f"test_patch names a file outside the workspace: {name}")
        original = _original(grader.repo_path, grader.base_commit, name)
        current = target.read_bytes() if target.is_file() else None
        if current == original and not (target.exists() and not target.is_file()):
            continue
        reverted.append(name)
        if target.is_dir() and not target.is_symlink():
            raise ValueError(f"the agent replaced test file {name} with a directory")
        target.unlink(missing_ok=True)
        if original is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(original)
    return reverted


def apply_patch(patch: str, workspace: Path) -> None:
    """Apply `patch` to the workspace's files with git, never reading the workspace's own `.git` (the agent could
    have put hooks or configuration there): git runs against an empty repository of its own."""
    with tempfile.TemporaryDirectory(prefix="interceptor-apply-") as empty:
        subprocess.run(["git", "init", "-q", "--bare", empty], check=True, capture_output=True)
        env = {**os.environ, "GIT_DIR": empty, "GIT_WORK_TREE": str(workspace), "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": os.devnull}
        result = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=workspace, env=env,
                                input=patch.encode(), capture_output=True)
    if result.returncode != 0:
        raise ValueError(f"git apply failed: {result.stderr.decode(errors='replace')[:500]}")


def _original(repo: Path, commit: str, name: str) -> bytes | None:
    result = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{name}"], capture_output=True)
    return result.stdout if result.returncode == 0 else None


def _git(repo: Path, *args: str, check: bool = True) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise TaskError(f"git {' '.join(args)} failed in {repo}: {result.stderr[:300]}")
    return result.stdout
