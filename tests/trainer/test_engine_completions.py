"""The local engine's /v1/completions: vLLM's response shape, token-exact logprobs (alone and batched), seeds,
stop semantics, and logprob modes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from tests.trainer.teacher_forcing import teacher_forced_logprobs
from trainer.engine import EngineConfig, LocalEngine

EXACT = 1e-5  # fp32: the engine's step-by-step, batched logprobs vs one forward pass over the same tokens
PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]
EXAMPLE = Path(__file__).parents[1] / "data" / "vllm_completion_example.json"


async def complete(http, **overrides) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 1, "return_token_ids": True,
            "logprobs": 1} | overrides
    async with http.post("/v1/completions", json=body) as response:
        payload = await response.json()
        assert response.status == 200, payload
        return payload


def token_logprobs(payload: dict) -> list[float]:
    return payload["choices"][0]["logprobs"]["token_logprobs"]


def token_ids(payload: dict) -> list[int]:
    return payload["choices"][0]["token_ids"]


async def test_completion_has_vllm_fields_and_shapes(http, engine):
    payload = await complete(http, prompt_logprobs=1)

    assert payload["id"].startswith("cmpl-")
    assert (payload["object"], payload["model"]) == ("text_completion", engine.model_name)
    assert isinstance(payload["created"], int)
    [choice] = payload["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str)
    assert choice["prompt_token_ids"] == PROMPT
    assert len(choice["token_ids"]) == 12 and (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    logprobs = choice["logprobs"]
    assert all(len(logprobs[key]) == 12 for key in logprobs)
    assert logprobs["text_offset"][0] == 0
    assert all(isinstance(lp, float) and lp <= 0 for lp in logprobs["token_logprobs"])
    assert all(1 <= len(top) <= 2 for top in logprobs["top_logprobs"])  # the sampled token, plus the best one
    assert choice["prompt_logprobs"][0] is None and len(choice["prompt_logprobs"]) == len(PROMPT)
    assert payload["usage"] | {"prompt_tokens_details": None, "completion_tokens_details": None} == {
        "prompt_tokens": 8, "total_tokens": 20, "completion_tokens": 12,
        "prompt_tokens_details": None, "completion_tokens_details": None,
    }


async def test_completion_has_the_keys_of_a_recorded_vllm_response_at_every_level(http):
    recorded = json.loads(EXAMPLE.read_text())["prompt_logprobs_over_prompt_and_completion"]
    vllm = recorded["response"]
    ours = await complete(http, **recorded["request"])

    assert _key_tree(ours) == _key_tree(vllm)
    assert _key_tree(ours["choices"][0]["prompt_logprobs"][1]) == _key_tree(vllm["choices"][0]["prompt_logprobs"][1])


def _key_tree(value):
    """The keys of nested dicts (lists: their first element); token-keyed dicts are compared by their values' keys."""
    if isinstance(value, dict):
        if all(key.lstrip("-").isdigit() for key in value) and value:
            return {"<token id>": _key_tree(next(iter(value.values())))}
        return {key: _key_tree(item) for key, item in value.items() if key != "top_logprobs"}
    if isinstance(value, list) and value:
        return [_key_tree(value[-1])]
    return type(value).__name__ if value is not None else None


async def test_token_logprobs_equal_a_teacher_forced_forward_pass(http, reference_model):
    payload = await complete(http, max_tokens=40, prompt_logprobs=0)

    sampled = token_ids(payload)
    expected = teacher_forced_logprobs(reference_model, PROMPT, sampled)
    assert token_logprobs(payload) == pytest.approx(expected, abs=EXACT)
    prompt_entries = payload["choices"][0]["prompt_logprobs"]
    prompt_logprobs = [prompt_entries[i][str(PROMPT[i])]["logprob"] for i in range(1, len(PROMPT))]
    assert prompt_logprobs == pytest.approx(
        teacher_forced_logprobs(reference_model, PROMPT[:1], PROMPT[1:]), abs=EXACT
    )


async def test_concurrent_requests_are_batched_and_stay_token_exact(http, engine, reference_model):
    # Ten requests for eight batch rows: rows join a batch that is already decoding, leave it at different lengths
    # (which trims its padding), and the last two wait for a free row.
    prompts = [[10 + (i * 37 + j * 11) % 500 for j in range(3 + 9 * i)] for i in range(10)]

    async def one(i: int) -> dict:
        await asyncio.sleep(0.003 * i)
        return await complete(http, prompt=prompts[i], max_tokens=80 + 7 * i, seed=100 + i)

    payloads = await asyncio.gather(*(one(i) for i in range(10)))

    assert engine.core.peak_batch_size == 8
    for prompt, payload in zip(prompts, payloads, strict=True):
        expected = teacher_forced_logprobs(reference_model, prompt, token_ids(payload))
        assert token_logprobs(payload) == pytest.approx(expected, abs=EXACT)


async def test_a_seed_repeats_its_sample_alone_or_batched_and_other_seeds_differ(http):
    alone = await complete(http, seed=7, max_tokens=20)
    batched = await asyncio.gather(*(complete(http, seed=seed, max_tokens=20) for seed in (7, 8, 7)))

    assert token_ids(batched[0]) == token_ids(batched[2]) == token_ids(alone)
    assert token_logprobs(batched[0]) == pytest.approx(token_logprobs(alone), abs=EXACT)
    assert token_ids(batched[1]) != token_ids(alone)


async def test_temperature_zero_is_greedy(http, reference_model):
    payload = await complete(http, temperature=0.0, seed=None, max_tokens=10)

    sequence = list(PROMPT)
    for token in token_ids(payload):
        with torch.inference_mode():
            assert token == int(reference_model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax())
        sequence.append(token)


async def test_processed_logprobs_are_after_temperature_and_raw_ones_before(tiny_model_dir, reference_model):
    request = {"max_tokens": 16, "temperature": 0.5, "seed": 3, "logprobs": 0}
    results = {}
    for mode in ("raw_logprobs", "processed_logprobs"):
        async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, logprobs_mode=mode)) as engine:
            result = await engine.core.generate(PROMPT, _params(request))
            results[mode] = result.token_ids, [record.logprob for record in result.logprobs]

    (raw_ids, raw), (processed_ids, processed) = results["raw_logprobs"], results["processed_logprobs"]
    assert raw_ids == processed_ids  # the mode changes what is reported, not what is sampled
    assert raw == pytest.approx(teacher_forced_logprobs(reference_model, PROMPT, raw_ids), abs=EXACT)
    assert processed == pytest.approx(
        teacher_forced_logprobs(reference_model, PROMPT, raw_ids, temperature=0.5), abs=EXACT
    )
    assert max(abs(a - b) for a, b in zip(raw, processed, strict=True)) > 0.1


async def test_processed_logprobs_renormalise_over_top_k(tiny_model_dir, reference_model):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, logprobs_mode="processed_logprobs")) as engine:
        result = await engine.core.generate(PROMPT, _params({"max_tokens": 8, "seed": 5, "top_k": 3, "logprobs": 3}))

    sequence = list(PROMPT)
    for token, record in zip(result.token_ids, result.logprobs, strict=True):
        with torch.inference_mode():
            logits = reference_model(input_ids=torch.tensor([sequence])).logits[0, -1]
        top3 = logits.topk(3)
        assert token in top3.indices.tolist()
        expected = top3.values.log_softmax(dim=-1)[top3.indices.tolist().index(token)]
        assert record.logprob == pytest.approx(float(expected), abs=EXACT)
        assert len(record.top) == 3 and all(value > -1e9 for _, value in record.top)
        sequence.append(token)


async def test_a_stop_token_id_ends_the_generation_and_is_kept_out_of_the_text(http):
    free = token_ids(await complete(http, max_tokens=20))
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i])  # an earlier repeat would stop first
    stopped = await complete(http, max_tokens=20, stop_token_ids=[free[k]])
    cut = await complete(http, max_tokens=k)

    assert token_ids(stopped) == free[: k + 1] and len(token_logprobs(stopped)) == k + 1
    assert stopped["choices"][0]["text"] == cut["choices"][0]["text"]
    assert (stopped["choices"][0]["finish_reason"], stopped["choices"][0]["stop_reason"]) == ("stop", free[k])


async def test_the_tokenizers_eos_stops_with_stop_reason_none(http, engine):
    eos = engine.core.policy.eos_token_id
    ended = await complete(http, min_tokens=3, logit_bias={str(eos): 100.0})  # 3 free tokens, then the eos
    cut = await complete(http, max_tokens=3)

    assert token_ids(ended) == token_ids(cut) + [eos]
    assert ended["choices"][0]["text"] == cut["choices"][0]["text"]
    assert (ended["choices"][0]["finish_reason"], ended["choices"][0]["stop_reason"]) == ("stop", None)


async def test_a_generation_config_eos_reports_its_id_as_stop_reason(http, engine):
    [other_eos] = engine.core.policy.extra_eos_token_ids  # the tiny model's <|endoftext|>
    ended = await complete(http, logit_bias={str(other_eos): 100.0})

    assert token_ids(ended) == [other_eos]
    assert (ended["choices"][0]["finish_reason"], ended["choices"][0]["stop_reason"]) == ("stop", other_eos)


async def test_ignore_eos_generates_through_the_eos(http, engine):
    eos = engine.core.policy.eos_token_id
    payload = await complete(http, max_tokens=5, ignore_eos=True, logit_bias={str(eos): 100.0})

    assert token_ids(payload) == [eos] * 5
    assert payload["choices"][0]["finish_reason"] == "length"


async def test_a_string_prompt_is_tokenized_with_the_models_tokenizer(http, engine):
    payload = await complete(http, prompt="what is two plus three", max_tokens=2)

    assert payload["choices"][0]["prompt_token_ids"] == engine.core.tokenizer.encode("what is two plus three")


def _params(body: dict):
    from trainer.engine.http.completions import parse_completion_request

    request = parse_completion_request({"prompt": PROMPT} | body, max_logprobs=20, vocab_size=640)
    return request.sampling_params({})


@pytest.mark.parametrize("example", ["completion_cut_by_length", "completion_ended_by_eos"])
def test_text_and_logprob_tokens_decode_as_in_a_recorded_vllm_response(engine_tokenizer, example):
    from trainer.engine.generation import GenerationResult
    from trainer.engine.http.completions import completion_response, parse_completion_request
    from trainer.engine.logprobs import TokenLogprob
    from trainer.engine.textcodec import TokenTexts

    recorded = json.loads(EXAMPLE.read_text())[example]
    vllm_choice = recorded["response"]["choices"][0]
    vllm_logprobs = vllm_choice["logprobs"]
    records = tuple(
        TokenLogprob(token_id=token, logprob=value, rank=1, top=())
        for token, value in zip(vllm_choice["token_ids"], vllm_logprobs["token_logprobs"], strict=True)
    )
    result = GenerationResult(
        prompt_ids=tuple(vllm_choice["prompt_token_ids"]),
        token_ids=tuple(vllm_choice["token_ids"]),
        logprobs=records,
        prompt_logprobs=None,
        finish_reason=vllm_choice["finish_reason"],
        stop_reason=vllm_choice["stop_reason"],
        stopped_on_token=vllm_choice["finish_reason"] == "stop",
        weight_version=0,
    )
    request = parse_completion_request(recorded["request"], max_logprobs=20, vocab_size=640)

    ours = completion_response(result, request, model="m", texts=TokenTexts(engine_tokenizer))["choices"][0]

    assert ours["text"] == vllm_choice["text"]
    assert ours["logprobs"]["tokens"] == vllm_logprobs["tokens"]
    assert ours["logprobs"]["text_offset"] == vllm_logprobs["text_offset"]
