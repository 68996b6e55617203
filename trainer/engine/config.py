"""The local engine's configuration: one frozen record, validated when built, made from CLI flags in `main.py`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["DTYPES", "EngineConfig", "LogprobsMode"]

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
_LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    model: Path
    host: str = "127.0.0.1"
    port: int = 8000  # 0 binds a free port; `LocalEngine.base_url` reports the real one
    served_model_name: str | None = None  # None: the `model` argument as given, as vLLM does
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    logprobs_mode: LogprobsMode = "raw_logprobs"
    max_batch_size: int = 8  # sequences decoded together (vLLM's --max-num-seqs)
    threads: int = 1  # torch intra-op threads; one is fastest and steadiest for tiny models on 2 cores
    max_logprobs: int = 20  # vLLM's --max-logprobs default: the most top logprobs a request may ask for
    seed: int = 0  # seeds the generator of requests without their own seed (vLLM's --seed)
    # Prompt positions whose full-vocabulary logits exist at once when computing prompt_logprobs: with Qwen's 151k
    # vocabulary 256 positions make ~155 MB per [positions, vocabulary] tensor, where a 7k-token prompt at once
    # took ~17 GB. Results do not depend on it, down to a few rows (a one-row product rounds differently).
    prompt_logprobs_chunk: int = 256
    # Keys and values of recent prompts kept for prompts that start with them (an agent's next turn:
    # `prefix_cache.py`; vLLM's automatic prefix caching); 0 turns it off.
    prefix_cache_mib: int = 512
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N" (vLLM's --device); a CUDA device must exist when it starts
    dtype: str = "float32"  # the weights' dtype (vLLM's --dtype); logits are taken in float32 whatever it is

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        if not self.model.is_dir():
            raise ValueError(f"model directory {self.model} does not exist")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {_LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be non-negative, got {self.max_logprobs}")
        if self.device != "cpu" and re.fullmatch(r"cuda(:\d+)?", self.device) is None:
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.prefix_cache_mib < 0:
            raise ValueError(f"prefix_cache_mib must be non-negative, got {self.prefix_cache_mib}")
        if self.prompt_logprobs_chunk < 1:
            raise ValueError(f"prompt_logprobs_chunk must be at least 1, got {self.prompt_logprobs_chunk}")

    @property
    def model_name(self) -> str:
        return self.served_model_name or str(self.model)
