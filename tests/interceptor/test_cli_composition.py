"""The `interceptor` command line is composed: each package contributes its subcommands through the
`interceptor.commands` entry points, and the interceptor package imports no package above it."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from interceptor.cli import CommandRegistry, main

ROOT = Path(__file__).resolve().parents[2]
HIGHER_PACKAGES = {"agents", "trainer"}
ALL_COMMANDS = ("serve", "inspect", "agents", "make-tiny-model", "engine", "run", "train", "demo")


@dataclass
class FakeEntryPoint:
    """Stands in for an installed `importlib.metadata.EntryPoint` of the `interceptor.commands` group."""

    name: str
    value: str
    loads: Callable[[], Any]

    def load(self) -> Any:
        return self.loads()


def _registers(*names: str) -> Callable[[], Callable[[CommandRegistry], None]]:
    def register(commands: CommandRegistry) -> None:
        for name in names:
            commands.add(name, lambda args: 0, f"the {name} command")

    return lambda: register


def _torch_missing() -> Any:
    raise ModuleNotFoundError("No module named 'torch'", name="torch")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_lists_the_subcommands_of_every_package():
    shown = subprocess.run([sys.executable, "-m", "interceptor.cli", "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    listed = {line.split()[0] for line in shown.stdout.splitlines() if line.startswith("    ") and line.split()}
    assert set(ALL_COMMANDS) <= listed
    assert "not available" not in shown.stdout


def test_no_interceptor_module_imports_a_higher_package():
    upward = []
    for path in sorted((ROOT / "interceptor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            upward += [f"{path.relative_to(ROOT)}:{node.lineno} imports {m}" for m in modules
                       if m.partition(".")[0] in HIGHER_PACKAGES]
    assert upward == []


def test_parsing_serve_and_inspect_help_never_load_torch():
    result = _python(
        "import sys\n"
        "from interceptor.cli import main\n"
        "try:\n"
        "    main(['inspect', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "from interceptor.cli import _build_parser, _installed_entry_points\n"
        "parser, _, _ = _build_parser(_installed_entry_points())\n"
        "parser.parse_args(['serve', '--upstream', 'http://127.0.0.1:1'])\n"
        "print('torch' in sys.modules, 'trl' in sys.modules)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False False"


def test_a_package_that_cannot_load_leaves_the_others_working():
    broken = FakeEntryPoint("trainer", "trainer.cli:register", _torch_missing)
    working = FakeEntryPoint("agents", "agents.cli:register", _registers("agents"))

    assert main(["agents"], entry_points=[broken, working]) == 0


def test_a_command_of_a_package_that_cannot_load_names_the_extra_to_install(capsys):
    broken = FakeEntryPoint("trainer", "trainer.cli:register", _torch_missing)

    assert main(["train", "--config", "x.toml"], entry_points=[broken]) == 2
    error = capsys.readouterr().err
    assert "interceptor train: error:" in error
    assert "trainer (trainer.cli:register)" in error and "pip install 'interceptor[train]'" in error
    assert "Traceback" not in error


def test_help_says_which_commands_are_not_available_and_why(capsys):
    broken = FakeEntryPoint("trainer", "trainer.cli:register", _torch_missing)

    with pytest.raises(SystemExit):
        main(["--help"], entry_points=[broken])
    shown = capsys.readouterr().out
    assert "not available" in shown and "interceptor[train]" in shown


def test_a_handler_missing_an_extras_dependency_names_the_extra(capsys):
    def register(commands: CommandRegistry) -> None:
        commands.add("train", lambda args: _torch_missing(), "train")

    assert main(["train"], entry_points=[FakeEntryPoint("trainer", "trainer.cli:register", lambda: register)]) == 2
    assert "interceptor train: error: needs torch, which is not installed: pip install 'interceptor[train]'" in (
        capsys.readouterr().err
    )


def test_a_command_name_registered_by_two_packages_is_refused_naming_both(capsys):
    first = FakeEntryPoint("alpha", "alpha.cli:register", _registers("train"))
    second = FakeEntryPoint("beta", "beta.cli:register", _registers("train"))

    assert main(["train"], entry_points=[first, second]) == 2
    error = capsys.readouterr().err
    assert "'train'" in error and "alpha (alpha.cli:register)" in error and "beta (beta.cli:register)" in error


def test_a_package_cannot_take_the_name_of_an_interceptor_command(capsys):
    assert main(["serve"], entry_points=[FakeEntryPoint("gamma", "gamma.cli:register", _registers("serve"))]) == 2
    error = capsys.readouterr().err
    assert "'serve'" in error and "by interceptor and by gamma" in error


def test_a_registered_handler_gets_its_parsed_arguments():
    seen: list[argparse.Namespace] = []

    def register(commands: CommandRegistry) -> None:
        echo = commands.add("echo", lambda args: seen.append(args) or 7, "echo")
        echo.add_argument("--word")

    assert main(["echo", "--word", "hi"], entry_points=[FakeEntryPoint("e", "e:register", lambda: register)]) == 7
    assert seen[0].word == "hi"
