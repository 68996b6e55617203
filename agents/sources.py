"""Where tasks come from: a JSON Lines task file (`agents.tasks`), or a Harbor task directory or a folder of them
(`agents.harbor`). `interceptor run`, `train`, `evaluate`, `replay` and the TRL environments all read tasks here."""

from __future__ import annotations

from pathlib import Path

from agents.harbor import is_harbor_dataset, load_harbor_tasks
from agents.tasks import Task, TaskError
from agents.tasks import load_tasks as load_task_file

__all__ = ["load_tasks"]


def load_tasks(path: Path | str, *, harbor_runs: bool = False) -> list[Task]:
    """`harbor_runs`: Harbor will run the tasks (`--driver harbor`): they must be Harbor tasks, read as it runs them."""
    path = Path(path)
    if harbor_runs and not (path.is_dir() and is_harbor_dataset(path)):
        raise TaskError(f"{path}: Harbor runs Harbor tasks (a directory with task.toml, or a folder of them)")
    if not path.is_dir():
        return load_task_file(path)
    if not is_harbor_dataset(path):
        raise TaskError(f"{path} is a directory, not a Harbor task or dataset (no task.toml in it or its folders)")
    return load_harbor_tasks(path, harbor_runs=harbor_runs)
