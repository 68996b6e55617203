"""The embedded default policy: the tiny model that `--upstream local` and the demo serve.

Built once into a directory and reused: the real Qwen vocabulary (agents' system prompts run to thousands of
tokens: Pi's first request is ~1.4k tokens, OpenCode's ~7.2k), a 32k context, and a minute or two of supervised
steps (trainer.tool_model) so the model answers a task by calling the shell tool with `answer N`, then finishes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .tiny_model import make_tiny_model
from .tool_model import ToolTrainingSpec, tool_model_spec, train_tool_calling

__all__ = ["ensure_local_model", "LOCAL_MODEL_SPEC"]

LOCAL_MODEL_SPEC = dataclasses.replace(tool_model_spec(real_vocab=True), max_position_embeddings=32768)
# Pi's and OpenCode's real first requests (system prompt and tools, secret removed): trained on, so the model
# answers inside those agents too.
AGENT_REQUESTS = tuple(sorted((Path(__file__).parent / "agent_requests").glob("*.json")))
_STAMP = "interceptor_local_model.json"


def ensure_local_model(model_dir: Path) -> Path:
    model_dir = Path(model_dir)
    if (model_dir / _STAMP).is_file() or (model_dir / "config.json").is_file():
        return model_dir  # built before, or a model of the user's own
    print(f"building the local tiny model in {model_dir} (once) ...", flush=True)
    make_tiny_model(model_dir, LOCAL_MODEL_SPEC)
    report = train_tool_calling(model_dir, ToolTrainingSpec(agent_requests=AGENT_REQUESTS))
    print(f"trained the tool loop in {report.seconds:.0f}s (loss {report.first_loss:.2f} -> {report.final_loss:.2f})")
    (model_dir / _STAMP).write_text(json.dumps({"tool_calling": dataclasses.asdict(report)}) + "\n")
    return model_dir
