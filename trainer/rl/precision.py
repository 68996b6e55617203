"""The trainer's precision and the generator's, kept in step.

TRL's `AsyncGRPOTrainer` loads the trained model in `AsyncGRPOConfig.dtype`; the generator (the local engine or
vLLM) serves in its own. When they differ, the trainer's logprob of a sampled token is not the one it was sampled
with, and the gap biases the importance ratio (https://huggingface.co/papers/2510.26788). `TrainConfig.dtype`:

- `"auto"`: bfloat16 on a CUDA GPU that supports it, float32 otherwise (on CPU, where the local engine serves
  float32 and bfloat16 matmuls are slow without AMX);
- `"float32"`, `"bfloat16"`, `"float16"`: as given.

The local engine is started in the trainer's dtype, so they agree by construction. A vLLM upstream says its dtype
at `/server_info` (a dev-mode endpoint, which weight sync needs anyway; the local engine serves the same shape);
`train` prints both at start, writes them to `OUT/setup.json`, and refuses a mismatch unless
`allow_dtype_mismatch = true`. Each step's `logprob_gap/*` metrics (`logprob_gap.py`) show what a mismatch costs.

`cpu_multiplies_bf16()` says whether this CPU has bf16 matrix units (AMX or AVX512-BF16): the embedded default's
build (`trainer.models.tool_model`) multiplies in bf16 only there. Elsewhere oneDNN emulates bf16 products, and a build
step took 8.5x as long as in fp32 (an AVX2-only 2-core machine, 2026-11-26: 6 steps 56.7 s against 6.7 s).
"""

from __future__ import annotations

import aiohttp

__all__ = ["DTYPES", "DtypeMismatch", "cpu_multiplies_bf16", "dtype_mismatch", "generator_dtype", "trainer_dtype"]

DTYPES = ("auto", "float32", "bfloat16", "float16")


class DtypeMismatch(ValueError):
    """The trainer and the generator hold the weights in different dtypes."""


def trainer_dtype(choice: str = "auto") -> str:
    """The dtype the trainer loads the model in, for `choice` (one of `DTYPES`)."""
    if choice not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {choice!r}")
    if choice != "auto":
        return choice
    import torch

    return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles or AVX512-BF16), as torch detects it; False
    where this torch cannot tell."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return any(probe is not None and probe() for probe in probes)


async def generator_dtype(base_url: str, *, timeout_s: float = 10.0) -> str | None:
    """The dtype a vLLM-compatible server at `base_url` holds its weights in ("bfloat16", ...), from its
    `/server_info?config_format=json`; None when it does not say (vLLM without `VLLM_SERVER_DEV_MODE=1`)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.get(f"{root}/server_info", params={"config_format": "json"}) as response:
                if response.status != 200:
                    return None
                info = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    try:
        dtype = info["vllm_config"]["model_config"]["dtype"]
    except (KeyError, TypeError):
        return None
    return str(dtype).removeprefix("torch.") if dtype else None


def dtype_mismatch(trainer: str, generator: str | None) -> str | None:
    """What to tell the user when the two differ (None when they agree or the generator does not say)."""
    if generator is None or generator == trainer:
        return None
    return (f"the trainer holds the weights in {trainer} but the generator serves {generator}: the logprobs the "
            f"trainer computes differ from the sampled ones (see logprob_gap/* in metrics.jsonl). Set dtype = "
            f"'{generator}' in the training config, or serve the model with --dtype {trainer}")
