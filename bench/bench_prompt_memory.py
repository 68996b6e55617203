"""Local engine memory for `prompt_logprobs` over a long prompt with the real 151k-token vocabulary: peak RSS.

    python bench/bench_prompt_memory.py                      # 7168 tokens (OpenCode's first request is ~7.2k)
    python bench/bench_prompt_memory.py --prompt-tokens 2048 --model DIR --json

Builds a random model of the embedded default's shape (real vocabulary, 32k context) in a temp dir unless given
`--model`, then measures each case in a fresh process (peak RSS is per process and never goes down): the engine
loaded and one request over the prompt without prompt logprobs, then the same with `prompt_logprobs` (top 1).
The difference is what prompt logprobs cost on top of the prefill.

Measured on the 2-core dev machine: with the whole prompt's logits at once, 3.3 GB at 1024 tokens and 5.8 GB at
2048 (2.5 MB per position: ~18 GB at 7168, where it was OOM-killed); in chunks of 256 positions, 1.4 GB at 2048 and
1.5 GB at 7168 (~630 MB over the prefill's 0.8-0.9 GB, whatever the prompt length).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def _measure(model: Path, *, prompt_tokens: int, prompt_logprobs: int | None) -> dict:
    from trainer.engine import EngineConfig, EngineCore, SamplingParams

    async with EngineCore(EngineConfig(model=model, port=0)) as core:
        vocab = core.policy.vocab_size
        prompt = [(i * 7919 + 13) % 150000 for i in range(prompt_tokens)]
        params = SamplingParams(max_tokens=1, seed=0, prompt_logprobs=prompt_logprobs)
        result = await core.generate(prompt, params)
        positions = len(result.prompt_logprobs or ())
    return {"vocab_size": vocab, "prompt_tokens": prompt_tokens, "prompt_logprobs": prompt_logprobs,
            "positions_with_logprobs": positions, "peak_rss_mib": _peak_rss_mib()}


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux reports KiB


def _child(model: Path, *, prompt_tokens: int, prompt_logprobs: int | None) -> dict:
    case = ["--child", "plain"] if prompt_logprobs is None else ["--child", "logprobs", "--top", str(prompt_logprobs)]
    command = [sys.executable, __file__, *case, "--model", str(model), "--prompt-tokens", str(prompt_tokens)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        why = "killed: out of memory?" if done.returncode == -9 else f"exit {done.returncode}"
        raise RuntimeError(f"measurement failed ({why}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model directory (default: build one with the real vocabulary)")
    parser.add_argument("--prompt-tokens", type=int, default=7168)
    parser.add_argument("--top", type=int, default=1, help="prompt_logprobs: top logprobs per position")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", choices=("plain", "logprobs"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        top = args.top if args.child == "logprobs" else None
        print(json.dumps(asyncio.run(_measure(args.model, prompt_tokens=args.prompt_tokens, prompt_logprobs=top))))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from trainer.models.local_model import LOCAL_MODEL_SPEC
            from trainer.models.tiny_model import make_tiny_model

            model = make_tiny_model(Path(scratch) / "real-vocab", LOCAL_MODEL_SPEC)
        plain = _child(model, prompt_tokens=args.prompt_tokens, prompt_logprobs=None)
        with_logprobs = _child(model, prompt_tokens=args.prompt_tokens, prompt_logprobs=args.top)
    results = {"without_prompt_logprobs": plain, "with_prompt_logprobs": with_logprobs,
               "prompt_logprobs_cost_mib": round(with_logprobs["peak_rss_mib"] - plain["peak_rss_mib"], 1)}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"local engine, vocabulary {plain['vocab_size']}, prompt of {args.prompt_tokens} tokens, one process each")
    print(f"  peak RSS without prompt_logprobs:      {plain['peak_rss_mib']:>9.1f} MiB")
    print(f"  peak RSS with prompt_logprobs={args.top:<2}       {with_logprobs['peak_rss_mib']:>9.1f} MiB")
    print(f"  prompt logprobs cost:                  {results['prompt_logprobs_cost_mib']:>9.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
