"""`interceptor agents install NAME...`: install the pinned agents (`agents.specs.packages`) into the user's cache.

    install_agent("pi")              # -> ~/.cache/interceptor/agents/pi-0.73.1/node_modules/.bin/pi
    install_agent("mini-swe-agent")  # -> ~/.cache/interceptor/agents/mini-swe-agent-2.4.6/venv/bin/python
    python -m agents.specs.install pi opencode [--dir DIR] [--force]

Idempotent: a finished install (stamp present, program runs and reports the pinned version) is left alone.
npm (or, for a PyPI agent, `python -m venv` and its pip) installs into a scratch directory beside the target, which is
renamed into place only once the program reports the pinned version, so an interrupted or concurrent install never
leaves a half-installed agent behind. (npm's .bin links are relative and a venv's interpreter finds its packages from
wherever the venv is, so both work from their new place.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agents.errors import AgentError, InstallError
from agents.specs.packages import PACKAGES, STAMP, AgentPackage, agents_dir, installed_binary

__all__ = ["install_agent", "main"]

INSTALL_TIMEOUT_S = 900.0  # OpenCode's platform binary is ~60 MB compressed; a slow mirror takes minutes
VERSION_TIMEOUT_S = 60.0  # `--version` of a cold native binary on a busy 2-core machine takes a few seconds


def install_agent(name: str | AgentPackage, *, root: Path | None = None, force: bool = False, npm: str = "npm",
                  runtime: Path | None = None) -> Path:
    """Install the pinned version of agent `name` (or of a package not in PACKAGES: the Harbor driver's box agents)
    unless already installed, and return its program's path. `runtime`: a directory put first on PATH when the
    installed program is checked (a Node.js newer than this host's)."""
    package = name if isinstance(name, AgentPackage) else PACKAGES.get(name)
    if package is None:
        raise InstallError(f"unknown agent {name!r}; known: {', '.join(sorted(PACKAGES))}")
    root = root or agents_dir()
    if not force and (existing := installed_binary(package, root)) is not None:
        return existing
    npm_path = shutil.which(npm)
    if package.registry == "npm" and npm_path is None:
        raise InstallError(f"`{npm}` is not on PATH: install Node.js >= 20 (with npm) first")
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{package.name}-", dir=root))
    try:
        if package.registry == "pypi":
            _pip_install(package, scratch)
            _check_module_version(package, package.program(scratch))
        else:
            assert npm_path is not None
            _npm_install(npm_path, package, scratch)
            _check_version(package, package.program(scratch), runtime=runtime)
        (scratch / STAMP).write_text(package.version + "\n")
        scratch.chmod(0o755)  # mkdtemp made it private; the install is a shared, read-only tool
        target = package.prefix(root)
        if target.exists():
            shutil.rmtree(target)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    installed = installed_binary(package, root)
    if installed is None:
        raise InstallError(f"{package.spec} was installed into {package.prefix(root)} but its program is missing")
    return installed


def _npm_install(npm: str, package: AgentPackage, prefix: Path) -> None:
    _install_step(f"npm install {package.spec}",
                  [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", package.spec])


def _pip_install(package: AgentPackage, prefix: Path) -> None:
    """A venv of its own (from the interpreter this project runs on, not its venv), and the package into it."""
    base = getattr(sys, "_base_executable", sys.executable)  # the venv's base interpreter: a venv of a venv nests
    venv = prefix / "venv"
    _install_step(f"python -m venv {venv}", [base, "-m", "venv", str(venv)])
    _install_step(f"pip install {package.spec}", [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input",
                                                  "--disable-pip-version-check", "--quiet", package.spec])


def _install_step(what: str, argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"`{what}` took more than {INSTALL_TIMEOUT_S:g}s") from exc
    if done.returncode != 0:
        raise InstallError(f"`{what}` failed ({done.returncode}):\n{done.stderr[-4000:]}")


def _check_module_version(package: AgentPackage, python: Path) -> None:
    """Run the agent's module with the venv's interpreter (`--help`: its dependencies load, offline, in a scratch
    HOME), then read the installed distribution's version."""
    with tempfile.TemporaryDirectory(prefix="interceptor-install-home-") as home:
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, **dict(package.env)}
        _run_check(package, [*package.command(python), "--help"], env)
        version = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
        done = _run_check(package, [str(python), "-I", "-c", version, package.package], env)
    reported = done.stdout.strip().splitlines()[-1:] or [""]
    if reported[0] != package.version:
        raise InstallError(f"{package.spec}: the venv holds version {reported[0]!r}")


def _run_check(package: AgentPackage, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{package.spec}: {' '.join(argv[:4])} did not run: {exc}") from exc
    if done.returncode != 0:
        raise InstallError(f"{package.spec}: {' '.join(argv[:4])} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done


def _check_version(package: AgentPackage, binary: Path, *, runtime: Path | None = None) -> None:
    """Run the installed program: a package whose install script did not run (OpenCode links its native binary
    in a postinstall step) or a platform without a prebuilt binary fails here rather than in a rollout."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=None if runtime is None else {**os.environ, "PATH": f"{runtime}{os.pathsep}{os.environ.get('PATH', '')}"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{binary} --version did not run: {exc}") from exc
    # Pi prints its version on stderr, OpenCode on stdout, Claude Code "2.1.330 (Claude Code)", Codex "codex-cli X",
    # Node.js "vX".
    reported = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or [""]
    if done.returncode != 0 or package.version not in (word.removeprefix("v") for word in reported[0].split()):
        raise InstallError(
            f"{binary} --version reported {reported[0]!r} (exit {done.returncode}), expected {package.version}:\n"
            f"{done.stderr[-2000:]}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `interceptor agents install NAME...` (argv is what follows `install`)."""
    parser = argparse.ArgumentParser(
        prog="interceptor agents install", description="install pinned agents (npm, PyPI) into the user's cache"
    )
    parser.add_argument("names", nargs="+", choices=sorted(PACKAGES), metavar="NAME", help=" | ".join(sorted(PACKAGES)))
    parser.add_argument("--dir", type=Path, default=None, help=f"install root (default: {agents_dir()})")
    parser.add_argument("--force", action="store_true", help="reinstall even when the pinned version is there")
    args = parser.parse_args(argv)
    for name in dict.fromkeys(args.names):
        package = PACKAGES[name]
        try:
            binary = install_agent(name, root=args.dir, force=args.force)
        except AgentError as exc:
            print(f"[agents] {package.spec}: {exc}", file=sys.stderr)
            return 1
        print(f"[agents] {package.spec}: {binary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
