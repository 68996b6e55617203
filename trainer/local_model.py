"""The embedded default policy: the tiny model that `--upstream local` and the demo serve.

Built once into a directory and reused: the real Qwen vocabulary (agents' system prompts run to thousands of
tokens: Pi's first request is ~1.4k tokens, OpenCode's ~7.2k), a 32k context, and, when the tool-calling trainer
is available, a few seconds of supervised steps so the model answers a task with a tool call and then finishes.
"""

from __future__ import annotations

import json
from pathlib import Path

from .tiny_model import TinyModelSpec, make_tiny_model

__all__ = ["ensure_local_model", "LOCAL_MODEL_SPEC"]

LOCAL_MODEL_SPEC = TinyModelSpec(real_vocab=True, max_position_embeddings=32768)
_STAMP = "interceptor_local_model.json"


def ensure_local_model(model_dir: Path) -> Path:
    model_dir = Path(model_dir)
    if (model_dir / _STAMP).is_file() or (model_dir / "config.json").is_file():
        return model_dir  # built before, or a model of the user's own
    print(f"building the local tiny model in {model_dir} (once) ...", flush=True)
    make_tiny_model(model_dir, LOCAL_MODEL_SPEC)
    trained = _train_tool_calling(model_dir)
    (model_dir / _STAMP).write_text(json.dumps({"tool_calling": trained}) + "\n")
    return model_dir


def _train_tool_calling(model_dir: Path) -> dict | None:
    try:
        from .tool_model import ToolTrainingSpec, train_tool_calling
    except ImportError:
        return None
    report = train_tool_calling(model_dir, ToolTrainingSpec())
    return {"report": str(report)}
