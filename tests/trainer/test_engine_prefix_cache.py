"""The local engine's prefix cache (`trainer/engine/prefix_cache.py`): an agent's next turn, which starts with its
previous prompt and reply, is prefilled from the cached keys and values of that prompt, and samples exactly what a
prefill of the whole prompt would; new weights empty it; prompt logprobs are always computed over the whole prompt."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.teacher_forcing import teacher_forced_logprobs
from tests.trainer.test_engine_control import _write_perturbed_weights
from trainer.engine import EngineConfig, LocalEngine, SamplingParams

EXACT = 1e-5
FIRST = [10 + (i * 37) % 400 for i in range(300)]  # an agent's prompt, long enough to be worth keeping


async def _turns(engine, params: SamplingParams) -> list:
    """Three turns of one conversation: each prompt is the last prompt, its reply and a tool result."""
    results, prompt = [], list(FIRST)
    for turn in range(3):
        result = await engine.generate(prompt, params)
        results.append((list(prompt), result))
        prompt = prompt + list(result.token_ids) + [300 + turn, 301, 302]
    return results


async def test_a_next_turn_reuses_the_last_prompt_and_samples_what_a_whole_prefill_samples(tiny_model_dir,
                                                                                          reference_model):
    params = SamplingParams(max_tokens=12, seed=5, logprobs=0, temperature=1.0)
    runs = {}
    for mib in (512, 0):
        async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, prefix_cache_mib=mib)) as engine:
            runs[mib] = await _turns(engine, params)
            cache = engine.core.prefix_cache
            if mib:
                assert cache.hits == 2  # turns 2 and 3
                assert cache.reused_tokens == len(runs[mib][0][0]) + len(runs[mib][1][0])
            else:
                assert cache.hits == 0 and len(cache) == 0
    for (prompt, cached), (_, whole) in zip(runs[512], runs[0], strict=True):
        assert cached.token_ids == whole.token_ids
        logprobs = [record.logprob for record in cached.logprobs]
        assert logprobs == pytest.approx([record.logprob for record in whole.logprobs], abs=EXACT)
        assert logprobs == pytest.approx(teacher_forced_logprobs(reference_model, prompt, cached.token_ids), abs=EXACT)


async def test_a_prompt_that_shares_only_its_start_reuses_that_much(engine):
    params = SamplingParams(max_tokens=4, seed=1)
    await engine.generate(FIRST, params)
    other = FIRST[:200] + [7] * 50
    await engine.generate(other, params)
    assert (engine.core.prefix_cache.hits, engine.core.prefix_cache.reused_tokens) == (1, 200)
    await engine.generate([3] * 40 + FIRST, params)  # shares nothing at its start
    assert engine.core.prefix_cache.hits == 1


async def test_new_weights_empty_the_cache(engine, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    params = SamplingParams(max_tokens=8, seed=3, logprobs=0)
    await engine.generate(FIRST, params)
    perturbed = AutoModelForCausalLM.from_pretrained(
        _write_perturbed_weights(tiny_model_dir, tmp_path / "perturbed"), dtype=torch.float32).eval()
    await engine.pause("wait")
    await engine.update_weights(perturbed.named_parameters())
    await engine.resume()
    after = await engine.generate(FIRST + [5, 6, 7], params)
    assert engine.core.prefix_cache.hits == 0  # the old weights' keys and values are gone
    expected = teacher_forced_logprobs(perturbed, FIRST + [5, 6, 7], after.token_ids)
    assert [record.logprob for record in after.logprobs] == pytest.approx(expected, abs=EXACT)


async def test_prompt_logprobs_are_computed_over_the_whole_prompt(engine, reference_model):
    params = SamplingParams(max_tokens=2, seed=1, prompt_logprobs=0)
    await engine.generate(FIRST, SamplingParams(max_tokens=2, seed=1))
    result = await engine.generate(FIRST + [11, 12], params)
    assert engine.core.prefix_cache.hits == 0
    scored = [entry.logprob for entry in result.prompt_logprobs[1:]]
    assert scored == pytest.approx(teacher_forced_logprobs(reference_model, FIRST[:1], FIRST[1:] + [11, 12]),
                                   abs=EXACT)


def test_a_negative_budget_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="prefix_cache_mib"):
        EngineConfig(model=tiny_model_dir, prefix_cache_mib=-1)
