"""`trainer.models.tool_forward` computes what transformers' Qwen3 computes: the training's own decoder (a shared prefix
run once, rows attending to it without copies, an interlude each row sees at its own positions) gives the hidden
states of the full sequences, so the tool model learns what the engine will run."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.models.tiny_model import make_tiny_model
from trainer.models.tool_forward import hidden_states, prefix_and_interlude, prefix_states
from trainer.models.tool_model import tool_model_spec


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = make_tiny_model(tmp_path_factory.mktemp("tool") / "model", tool_model_spec(real_vocab=False))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():  # q/k norms of 1 and small weights make every position look alike: spread them out
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.05)
    return model


def reference(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


def embed(model, rows: list[list[int]]) -> torch.Tensor:
    return model.model.embed_tokens(torch.tensor(rows))


def test_rows_from_position_zero_match_the_model(model):
    rows = [[5, 9, 13, 2, 7, 40], [8, 8, 1, 30, 22, 3]]
    with torch.no_grad():
        ours = hidden_states(model, embed(model, rows))
    for i, row in enumerate(rows):
        torch.testing.assert_close(ours[i], reference(model, row), atol=1e-5, rtol=1e-4)


def test_rows_after_a_shared_prefix_match_the_full_sequences(model):
    prefix_ids, rows = [3, 14, 15, 92, 65, 35, 89, 79], [[5, 9, 13, 2], [8, 8, 1, 30]]
    with torch.no_grad():
        prefix = prefix_states(model, embed(model, [prefix_ids]))
        ours = hidden_states(model, embed(model, rows), prefix=prefix)
    for i, row in enumerate(rows):
        torch.testing.assert_close(ours[i], reference(model, prefix_ids + row)[len(prefix_ids):], atol=1e-5, rtol=1e-4)


def test_an_interlude_is_seen_by_each_row_at_its_own_split(model):
    """The interlude is computed once after the first row's own tokens: exact for that row."""
    prefix_ids, own, interlude_ids, after = [3, 14, 15, 92], [5, 9], [26, 53, 58, 97, 93], [23, 84]
    with torch.no_grad():
        prefix, interlude = prefix_and_interlude(model, embed(model, [prefix_ids + own + interlude_ids]),
                                                 context=len(prefix_ids), start=len(prefix_ids + own))
        ours = hidden_states(model, embed(model, [own + after]), prefix=prefix, interlude=interlude,
                             splits=[len(own)])
    full = reference(model, prefix_ids + own + interlude_ids + after)
    torch.testing.assert_close(ours[0, :len(own)], full[len(prefix_ids):len(prefix_ids) + len(own)],
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours[0, len(own):], full[-len(after):], atol=1e-5, rtol=1e-4)


def test_selected_positions_get_the_states_the_full_rows_have_there(model):
    """A step reads the states only where they predict a target: the last layer runs there alone, exactly."""
    prefix_ids, own, interlude_ids = [3, 14, 15, 92], [[5, 9, 13, 2, 7], [8, 8, 1, 30, 22]], [26, 53, 58]
    select = torch.tensor([[False, True, False, True, True], [True, False, False, False, False]])
    with torch.no_grad():
        full = hidden_states(model, embed(model, own))
        torch.testing.assert_close(hidden_states(model, embed(model, own), select=select), full[select])
        prefix, interlude = prefix_and_interlude(model, embed(model, [prefix_ids + own[0][:2] + interlude_ids]),
                                                 context=len(prefix_ids), start=len(prefix_ids) + 2)
        for extra in ({}, {"interlude": interlude, "splits": [2, 3]}):
            full = hidden_states(model, embed(model, own), prefix=prefix, **extra)
            ours = hidden_states(model, embed(model, own), prefix=prefix, select=select, **extra)
            torch.testing.assert_close(ours, full[select])
    assert hidden_states(model, embed(model, own), select=torch.zeros_like(select)).shape == (0, full.shape[-1])

