"""Chat templates shipped as data by TRL, found without importing TRL.

TRL keeps the original and the prefix-preserving *training* variants of common chat templates as Jinja files in
`trl/chat_templates/`. The interceptor must not import trl (it pulls torch), so it locates the package directory
through the import system's spec and reads the files as plain text.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from interceptor.errors import ConfigError

__all__ = ["trl_chat_template", "training_template_for"]


def _trl_template_dir() -> Path:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("TRL's chat templates are needed here but the 'trl' package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "chat_templates"


def trl_chat_template(name: str) -> str:
    """The text of `trl/chat_templates/<name>.jinja`."""
    path = _trl_template_dir() / f"{name}.jinja"
    if not path.is_file():
        raise ConfigError(f"TRL ships no chat template named {name!r} (looked for {path})")
    return path.read_text(encoding="utf-8")


def training_template_for(template: str) -> str | None:
    """The prefix-preserving training variant of `template`, when TRL knows the template; else None.

    Identity is exact text equality, as in TRL's own `get_training_chat_template`.
    """
    try:
        directory = _trl_template_dir()
    except ConfigError:
        return None
    for original in sorted(directory.glob("*.jinja")):
        if original.stem.endswith("_training"):
            continue
        if original.read_text(encoding="utf-8") == template:
            training = directory / f"{original.stem}_training.jinja"
            return training.read_text(encoding="utf-8") if training.is_file() else None
    return None
