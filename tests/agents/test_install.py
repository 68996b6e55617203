"""Installing pinned agents, with a fake `npm` that lays out what `npm install --prefix` would, and for a PyPI
agent a real venv and pip installing a wheel made here from a local folder (no network either way)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from agents import InstallError
from agents.specs.install import install_agent, main
from agents.specs.packages import MINI_SWE, PACKAGES, PI, STAMP

# Lays out <prefix>/node_modules/.bin/pi reporting $FAKE_VERSION, as `npm install --prefix P pkg@v` would, and
# counts its calls.
FAKE_NPM = """#!/bin/sh
echo call >> "$NPM_CALLS"
prefix=$3
mkdir -p "$prefix/node_modules/.bin"
printf '#!/bin/sh\\necho %s\\n' "$FAKE_VERSION" > "$prefix/node_modules/.bin/pi"
chmod +x "$prefix/node_modules/.bin/pi"
[ -z "$FAKE_NPM_FAIL" ] || { echo "npm ERR! 404 Not Found" >&2; exit 1; }
"""


@pytest.fixture
def fake_npm(tmp_path, monkeypatch) -> Path:
    npm = tmp_path / "npm-bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(FAKE_NPM)
    npm.chmod(0o755)
    calls = tmp_path / "npm-calls"
    monkeypatch.setenv("NPM_CALLS", str(calls))
    monkeypatch.setenv("FAKE_VERSION", PI.version)
    monkeypatch.setenv("PATH", f"{npm.parent}:/usr/bin:/bin")
    return calls


def npm_calls(calls: Path) -> int:
    return len(calls.read_text().split()) if calls.exists() else 0


def test_install_lays_out_the_pinned_agent_and_is_idempotent(tmp_path, fake_npm):
    root = tmp_path / "agents"
    binary = install_agent("pi", root=root)
    assert binary == PI.prefix(root) / "node_modules" / ".bin" / "pi"
    assert (PI.prefix(root) / STAMP).read_text().strip() == PI.version
    assert install_agent("pi", root=root) == binary
    assert npm_calls(fake_npm) == 1, "a finished install is not redone"
    install_agent("pi", root=root, force=True)
    assert npm_calls(fake_npm) == 2
    assert [p.name for p in root.iterdir()] == [PI.prefix(root).name], "no scratch directory is left behind"


def test_a_program_reporting_another_version_is_not_installed(tmp_path, fake_npm, monkeypatch):
    monkeypatch.setenv("FAKE_VERSION", "0.0.1")
    with pytest.raises(InstallError, match="expected 0.73.1"):
        install_agent("pi", root=tmp_path / "agents")
    assert list((tmp_path / "agents").iterdir()) == []


def test_npm_failure_is_reported_with_its_stderr(tmp_path, fake_npm, monkeypatch):
    monkeypatch.setenv("FAKE_NPM_FAIL", "1")
    with pytest.raises(InstallError, match="404 Not Found"):
        install_agent("pi", root=tmp_path / "agents")


def test_missing_npm_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InstallError, match="Node.js"):
        install_agent("pi", root=tmp_path / "agents")


def test_unknown_agent_is_refused(tmp_path):
    with pytest.raises(InstallError, match="known: claude, codex, mini-swe-agent, opencode, pi"):
        install_agent("aider", root=tmp_path)


def test_main_installs_and_returns_nonzero_on_failure(tmp_path, fake_npm, monkeypatch, capsys):
    assert main(["pi", "--dir", str(tmp_path / "agents")]) == 0
    assert str(PI.prefix(tmp_path / "agents")) in capsys.readouterr().out
    monkeypatch.setenv("FAKE_VERSION", "0.0.1")
    assert main(["pi", "--dir", str(tmp_path / "other"), "--force"]) == 1
    assert "expected 0.73.1" in capsys.readouterr().err


def test_the_readme_command_installs_every_packaged_agent(monkeypatch, capsys):
    """`interceptor agents install pi opencode claude codex mini-swe-agent`, exactly as the README writes it, reaches
    the installer with every name (it once accepted only pi and opencode)."""
    import agents.specs.install
    from interceptor.cli import main as interceptor_main

    installed = []
    monkeypatch.setattr(agents.specs.install, "install_agent",
                        lambda name, **kwargs: installed.append(name) or Path("/agents") / name)

    command = next(line for line in Path("README.md").read_text().splitlines() if "interceptor agents install" in line)
    names = command.split("`")[1].split()[3:]
    assert sorted(names) == sorted(PACKAGES)
    assert interceptor_main(["agents", "install", *names]) == 0
    assert installed == names


def write_wheel(folder: Path, version: str) -> Path:
    """A wheel of `mini-swe-agent` at `version` whose module answers `python -m minisweagent --help`, laid out by
    hand (a wheel is a zip with its metadata), so no build backend is fetched."""
    dist = f"mini_swe_agent-{version}.dist-info"
    files = {
        "minisweagent/__init__.py": "",
        "minisweagent/__main__.py": "import sys\nprint('usage: mini')\nsys.exit(0 if '--help' in sys.argv else 2)\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: mini-swe-agent\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"mini_swe_agent-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def test_a_pypi_agent_is_installed_into_a_venv_of_its_own_that_works_from_its_final_place(tmp_path, monkeypatch):
    write_wheel(tmp_path / "wheels", MINI_SWE.version)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    root = tmp_path / "agents"
    python = install_agent("mini-swe-agent", root=root)
    assert python == MINI_SWE.prefix(root) / "venv" / "bin" / "python"
    assert (MINI_SWE.prefix(root) / STAMP).read_text().strip() == MINI_SWE.version
    assert [p.name for p in root.iterdir()] == [MINI_SWE.prefix(root).name], "no scratch directory is left behind"
    # Installed in a scratch folder and renamed: the venv's interpreter still finds its packages.
    done = subprocess.run([*MINI_SWE.command(python), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "usage: mini" in done.stdout
    assert install_agent("mini-swe-agent", root=root) == python  # a finished install is kept


def test_a_pypi_agent_whose_pinned_version_is_not_found_is_not_installed(tmp_path, monkeypatch):
    write_wheel(tmp_path / "wheels", "2.0.0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    with pytest.raises(InstallError, match="pip install mini-swe-agent==2.4.6.*failed"):
        install_agent("mini-swe-agent", root=tmp_path / "agents")
    assert list((tmp_path / "agents").iterdir()) == []
