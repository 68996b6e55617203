"""The local CPU policy engine: a transformers causal LM served with the part of vLLM's OpenAI server this project
relies on (`/v1/completions` with token ids and logprobs, chat completions, dev-mode pause/resume/reload), plus an
in-process API for a trainer in the same process. See `engine.py` for the entry point and `http/server.py` for routes."""

from trainer.engine.config import EngineConfig, LogprobsMode
from trainer.engine.core import EngineCore
from trainer.engine.engine import LocalEngine
from trainer.engine.errors import EngineError, EngineStopped, GenerationFailed, InvalidRequest
from trainer.engine.generation import GenerationResult
from trainer.engine.logprobs import TokenLogprob
from trainer.engine.sampling import SamplingParams
from trainer.engine.worker import PauseMode

__all__ = [
    "EngineConfig",
    "EngineCore",
    "EngineError",
    "EngineStopped",
    "GenerationFailed",
    "GenerationResult",
    "InvalidRequest",
    "LocalEngine",
    "LogprobsMode",
    "PauseMode",
    "SamplingParams",
    "TokenLogprob",
]
