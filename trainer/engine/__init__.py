"""The local CPU policy engine: a transformers causal LM served with the part of vLLM's OpenAI server this project
relies on (`/v1/completions` with token ids and logprobs, chat completions, dev-mode pause/resume/reload), plus an
in-process API for a trainer in the same process. See `engine.py` for the entry point and `server.py` for routes."""

from .config import EngineConfig, LogprobsMode
from .core import EngineCore
from .engine import LocalEngine
from .errors import EngineError, EngineStopped, GenerationFailed, InvalidRequest
from .generation import GenerationResult
from .logprobs import TokenLogprob
from .sampling import SamplingParams
from .worker import PauseMode

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
