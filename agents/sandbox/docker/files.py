"""Files into and out of containers through the Docker daemon (`docker cp` with a tar stream), never a bind mount.

What `agents.sandbox.docker.remote` needs, and all a daemon on another machine (`DOCKER_HOST`) allows:
- `copy_in`: host paths (each with its parent directories up to a root) into a container, owners and modes kept;
- `copy_out`: a container's directory onto this host, taken as hostile: members that would land outside the
  destination, links that point out of it, devices and setuid bits are left out (`tarfile`'s `data` filter);
- `layered_image`: an image made from another with host paths added at their own paths (an agent's install, its
  interpreter) and this package's in-box scripts, made once per content and kept as `interceptor/box:<key>`.

The functions block (a `docker` client each): call them in a thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from agents.errors import AgentError

__all__ = ["DaemonFileError", "copy_in", "copy_out", "layered_image", "layer_key"]

_CP_S = 600.0  # one copy through the daemon (an agent's install is a few hundred MB)
_CALL_S = 60.0  # docker create / commit / rm / image inspect


class DaemonFileError(AgentError):
    """A copy through the daemon failed (the client's own message)."""


def copy_in(docker: str, env: dict[str, str], container: str, root: Path, paths: Sequence[Path], *,
            as_root: bool = False, extra: Sequence[tuple[str, bytes]] = ()) -> None:
    """Copy `paths` (each under `root`, directories whole, links as links) into `container` at the same paths,
    their parents between `root` and them included. `as_root`: owned by root there (what the box only reads);
    else with this host's owners. `extra`: (path under root, content) files, mode 0644, added as well."""
    command = [docker, "cp", "--archive", "-", f"{container}:{root}"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=env)  # fmt: skip
    assert process.stdin is not None
    added: set[str] = set()
    owner: Callable[[tarfile.TarInfo], tarfile.TarInfo] = _owned_by_root if as_root else _kept
    try:
        with tarfile.open(fileobj=process.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in paths:
                relative = path.relative_to(root)
                # Parents as the host has them (modes of a rollout's directories); an image's own are kept, and
                # the daemon makes those it lacks.
                for parent in () if as_root else reversed(relative.parents[:-1]):
                    if str(parent) not in added:
                        added.add(str(parent))
                        tar.add(root / parent, arcname=str(parent), recursive=False, filter=owner)
                tar.add(path, arcname=str(relative), recursive=True, filter=owner)
            for name, data in extra:
                info = owner(tarfile.TarInfo(name))
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, _Reader(data))
    except BrokenPipeError:
        pass  # the client ended early: its stderr says why
    finally:
        process.stdin.close()
    error = process.stderr.read() if process.stderr else b""
    if process.wait(timeout=_CP_S) != 0:
        raise DaemonFileError(f"docker cp into {container} failed: {error.decode(errors='replace').strip()}")


def copy_out(docker: str, env: dict[str, str], container: str, source: Path, destination: Path) -> None:
    """Replace `destination` (a directory of this host) with the container's `source` directory."""
    process = subprocess.Popen([docker, "cp", f"{container}:{source}", "-"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)  # fmt: skip
    assert process.stdout is not None
    landing = Path(tempfile.mkdtemp(prefix=".pulled-", dir=destination.parent))
    try:
        with tarfile.open(fileobj=process.stdout, mode="r|") as tar:
            for member in tar:
                # The archive's top is `source`'s own name: what is under it lands under `landing`.
                inner = Path(*Path(member.name).parts[1:])
                if not inner.parts:
                    continue
                member.name = str(inner)
                if member.islnk():  # a hard link names another member by its path in the archive
                    member.linkname = str(Path(*Path(member.linkname).parts[1:]))
                tar.extract(member, landing, filter=_hostile)
        error = process.stderr.read() if process.stderr else b""
        if process.wait(timeout=_CP_S) != 0:
            raise DaemonFileError(f"docker cp out of {container} failed: {error.decode(errors='replace').strip()}")
        shutil.rmtree(destination, ignore_errors=True)
        landing.rename(destination)
    except (tarfile.TarError, OSError) as exc:
        raise DaemonFileError(f"the copy out of {container} is not a usable archive: {exc}") from exc
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(landing, ignore_errors=True)


def layer_key(image_id: str, paths: Sequence[Path], scripts: Sequence[tuple[str, bytes]]) -> str:
    """What a layered image is made of: the base image's id, each host path as it is now (a reinstall makes a new
    directory, so inode and mtime change) and the scripts' content."""
    described = [image_id, [_stamp(path) for path in paths], [(name, hashlib.sha256(data).hexdigest())
                                                               for name, data in scripts]]  # fmt: skip
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:20]


def layered_image(docker: str, env: dict[str, str], image: str, key: str, paths: Sequence[Path],
                  scripts: Sequence[tuple[str, bytes]], *, label: str) -> str:
    """`interceptor/box:<key>`: `image` with `paths` (owned by root) and `scripts` (absolute paths) added; made
    here unless the daemon has it already."""
    tag = f"interceptor/box:{key}"
    if _run([docker, "image", "inspect", "--format", "{{.Id}}", tag], env).returncode == 0:
        return tag
    name = f"interceptor-layer-{secrets.token_hex(6)}"
    made = _run([docker, "create", "--name", name, "--label", f"{label}=1", image, "true"], env)
    if made.returncode != 0:
        raise DaemonFileError(f"docker create of {image} failed: {made.stderr.strip()}")
    try:
        root = Path("/")
        copy_in(docker, env, name, root, paths, as_root=True,
                extra=[(name.lstrip("/"), data) for name, data in scripts])  # fmt: skip
        committed = _run([docker, "commit", "--change", f"LABEL {label}.layer={key}", name, tag], env)
        if committed.returncode != 0:
            raise DaemonFileError(f"docker commit of {image} failed: {committed.stderr.strip()}")
    finally:
        _run([docker, "rm", "-f", name], env)
    return tag


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=_CALL_S, check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        raise DaemonFileError(f"{' '.join(command[:3])} did not answer in {_CALL_S:g} s") from exc


def _stamp(path: Path) -> tuple[str, int, int, int]:
    stat = path.stat()
    return str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _kept(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uname = info.gname = ""  # numeric owners: the host's names mean nothing in the image
    return info


def _hostile(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo | None:
    """tarfile's `data` filter, with a refused member left out instead of ending the copy."""
    try:
        return tarfile.data_filter(member, destination)
    except tarfile.FilterError:
        return None


class _Reader:
    """A file object over bytes, for `TarFile.addfile`."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._at + size
        chunk, self._at = self._data[self._at : end], min(end, len(self._data))
        return chunk
