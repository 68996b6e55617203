"""`interceptor agents install pi|opencode`: install the pinned agents from npm into the user's cache.

    install_agent("pi")            # -> ~/.cache/interceptor/agents/pi-0.73.1/node_modules/.bin/pi
    python -m agents.specs.install pi opencode [--dir DIR] [--force]

Idempotent: a finished install (stamp present, program runs and reports the pinned version) is left alone.
npm installs into a scratch directory beside the target, which is renamed into place only once the program reports
the pinned version, so an interrupted or concurrent install never leaves a half-installed agent behind.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agents.errors import AgentError, InstallError
from agents.specs.packages import PACKAGES, STAMP, AgentPackage, agents_dir, installed_binary

__all__ = ["install_agent", "main"]

NPM_TIMEOUT_S = 900.0  # OpenCode's platform binary is ~60 MB compressed; a slow mirror takes minutes
VERSION_TIMEOUT_S = 60.0  # `--version` of a cold native binary on a busy 2-core machine takes a few seconds


def install_agent(name: str, *, root: Path | None = None, force: bool = False, npm: str = "npm") -> Path:
    """Install the pinned version of agent `name` (unless already installed) and return its program's path."""
    package = PACKAGES.get(name)
    if package is None:
        raise InstallError(f"unknown agent {name!r}; known: {', '.join(sorted(PACKAGES))}")
    root = root or agents_dir()
    if not force and (existing := installed_binary(package, root)) is not None:
        return existing
    npm_path = shutil.which(npm)
    if npm_path is None:
        raise InstallError(f"`{npm}` is not on PATH: install Node.js >= 20 (with npm) first")
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{package.name}-", dir=root))
    try:
        _npm_install(npm_path, package, scratch)
        _check_version(package, scratch / "node_modules" / ".bin" / package.bin)
        (scratch / STAMP).write_text(package.version + "\n")
        scratch.chmod(0o755)  # mkdtemp made it private; the install is a shared, read-only tool
        target = package.prefix(root)
        if target.exists():
            shutil.rmtree(target)
        scratch.rename(target)  # npm's .bin links are relative, so the tree works from its new place
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    installed = installed_binary(package, root)
    if installed is None:
        raise InstallError(f"{package.spec} was installed into {package.prefix(root)} but its program is missing")
    return installed


def _npm_install(npm: str, package: AgentPackage, prefix: Path) -> None:
    argv = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", package.spec]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"`npm install {package.spec}` took more than {NPM_TIMEOUT_S:g}s") from exc
    if done.returncode != 0:
        raise InstallError(f"`npm install {package.spec}` failed ({done.returncode}):\n{done.stderr[-4000:]}")


def _check_version(package: AgentPackage, binary: Path) -> None:
    """Run the installed program: a package whose install script did not run (OpenCode links its native binary
    in a postinstall step) or a platform without a prebuilt binary fails here rather than in a rollout."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{binary} --version did not run: {exc}") from exc
    # Pi prints its version on stderr, OpenCode on stdout, Claude Code "2.1.330 (Claude Code)", Codex "codex-cli X".
    reported = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or [""]
    if done.returncode != 0 or package.version not in reported[0].split():
        raise InstallError(
            f"{binary} --version reported {reported[0]!r} (exit {done.returncode}), expected {package.version}:\n"
            f"{done.stderr[-2000:]}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `interceptor agents install NAME...` (argv is what follows `install`)."""
    parser = argparse.ArgumentParser(
        prog="interceptor agents install", description="install pinned agents from npm into the user's cache"
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
