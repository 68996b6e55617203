"""Bad input to the local engine gets a vLLM-shaped 4xx that says what is wrong, and the engine keeps serving."""

from __future__ import annotations

import pytest

GOOD = {"prompt": [10, 20, 30], "max_tokens": 4}


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        ({"prompt": [10, 640], "max_tokens": 4}, 400, None, "Token id 640 is out of vocabulary"),
        ({"prompt": [10, -1], "max_tokens": 4}, 400, "prompt", "non-negative integer token ids"),
        (
            {"prompt": [10] * 8000, "max_tokens": 500},
            400,
            "input_tokens",
            "You passed 8000 input tokens and requested 500 output tokens. However, the model's context length is "
            "only 8192 tokens, resulting in a maximum input length of 7692 tokens.",
        ),
        ({"prompt": [10], "max_tokens": 9000}, 400, "max_tokens", "cannot be greater than max_model_len"),
        (GOOD | {"n": 2}, 400, "n", "one sequence per request; got n=2"),
        (GOOD | {"max_tokens": "many"}, 400, "max_tokens", "`max_tokens` must be an integer"),
        (GOOD | {"max_tokens": 0}, 400, "max_tokens", "max_tokens must be at least 1, got 0."),
        (GOOD | {"temperature": "hot"}, 400, "temperature", "`temperature` must be a number"),
        (GOOD | {"temperature": 3}, 400, "temperature", "temperature must be in [0, 2], got 3.0."),
        (GOOD | {"top_p": 0}, 400, "top_p", "top_p must be in (0, 1], got 0.0."),
        (GOOD | {"top_k": -2}, 400, None, "top_k must be 0 (disable), or at least 1, got -2."),
        (GOOD | {"seed": 1.5}, 400, "seed", "`seed` must be an integer"),
        (GOOD | {"stop_token_ids": "7"}, 400, "stop_token_ids", "must be a list of integers"),
        (GOOD | {"logprobs": 21}, 400, "logprobs", "Requested sample logprobs of 21, which is greater than max"),
        (GOOD | {"prompt_logprobs": -2}, 400, "prompt_logprobs", "must be a positive value or -1"),
        (GOOD | {"logit_bias": {"x": 1}}, 400, "logit_bias", "cannot be converted to integer token IDs"),
        (GOOD | {"min_tokens": 9}, 400, None, "min_tokens must be less than or equal to max_tokens=4, got 9."),
        (GOOD | {"ignore_eos": "yes"}, 400, "ignore_eos", "`ignore_eos` must be a boolean"),
        (GOOD | {"stream": True}, 400, "stream", "`stream` is not supported by the local engine"),
        (GOOD | {"presence_penalty": 0.5}, 400, "presence_penalty", "not supported by the local engine"),
        ({"prompt": "", "max_tokens": 4}, 400, "prompt", "Either prompt or prompt_embeds must be provided"),
        ({"prompt": [], "max_tokens": 4}, 400, None, "The decoder prompt cannot be empty"),
        ({"max_tokens": 4}, 400, "prompt", "Either prompt or prompt_embeds must be provided"),
        ({"prompt": [[1, 2], [3]], "max_tokens": 4}, 400, "prompt", "one prompt per request; got 2"),
        ({"prompt": {"ids": [1]}}, 400, "prompt", "prompt must be a string or a list of token ids"),
        (GOOD | {"model": "gpt-4"}, 404, None, "The model `gpt-4` does not exist."),
    ],
)
async def test_bad_completion_request_gets_an_error_naming_the_problem(http, body, status, param, message):
    async with http.post("/v1/completions", json=body) as response:
        payload = await response.json()

    assert response.status == status
    error = payload["error"]
    assert message in error["message"]
    assert (error["param"], error["code"]) == (param, status)
    assert error["type"] == ("BadRequestError" if status == 400 else "NotFoundError")
    await _still_serves(http)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
async def test_a_body_that_is_not_a_json_object_is_a_400(http, raw):
    async with http.post("/v1/completions", data=raw, headers={"Content-Type": "application/json"}) as response:
        payload = await response.json()

    assert response.status == 400 and payload["error"]["type"] == "BadRequestError"
    assert "JSON" in payload["error"]["message"]
    await _still_serves(http)


async def test_unknown_fields_are_accepted(http):
    async with http.post("/v1/completions", json=GOOD | {"user": "me", "some_future_field": {"x": 1}}) as response:
        assert response.status == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"method": "reload_weights", "kwargs": {"weights_path": "/no/such/dir"}}, "is not a directory"),
        ({"method": "sleep"}, "not supported by the local engine"),
        ({"kwargs": {}}, "Missing 'method'"),
    ],
)
async def test_bad_collective_rpc_is_a_400(http, engine, body, message):
    async with http.post("/collective_rpc", json=body) as response:
        payload = await response.json()

    assert response.status == 400 and message in payload["error"]["message"]
    assert engine.weight_version == 0


async def test_unknown_pause_mode_is_a_400(http, engine):
    async with http.post("/pause", params={"mode": "later"}) as response:
        assert response.status == 400
    assert not engine.is_paused


async def _still_serves(http) -> None:
    async with http.post("/v1/completions", json=GOOD) as response:
        assert response.status == 200
