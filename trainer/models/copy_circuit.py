"""The structured initialisation of the tool-calling tiny model: an induction ("copy") circuit.

Copying a number of any length out of a prompt needs an induction circuit, which gradient descent finds only after
a long plateau (hundreds of steps at this size). `wire_copy_circuit` writes one into a `tool_model_spec()` model
(hidden 128, head_dim 64, two layers) before training (`trainer.models.tool_model`): three layer-0 heads attend to the
previous, the one-before-previous and the third token back by position, and head 0 of layer 1 attends to where the
last two tokens occurred before, the third back breaking ties, and copies the token that followed. Every weight
stays trainable. It also zeroes the output rows of tokens the episodes never use, so their logits are exactly 0 and
the full-vocabulary softmax costs only the used rows.

Why the third token: a one-digit number's end. After the call's `answer 6` the two tokens to match are " " and "6",
which an agent's prompt holds wherever a number starts with 6 (Claude Code's date " 2026-...", versions, counts),
each followed by a digit; the task's "answer 6." is one of a dozen places to copy from, and the model wrote
`answer 2026` for the task "Submit the answer 2." inside Claude Code's prompt. With the token before them
(`answer`) in the match, the task's place scores higher than every other.
"""

from __future__ import annotations

import math

__all__ = ["ROPE_THETA", "wire_copy_circuit"]

ROPE_THETA = 1_000_000.0  # Qwen3's own base: the copy head's content dimensions barely rotate over a few hundred tokens


# The residual stream (hidden 128) is split: token identity (with a "this is a digit" flag, which is what tells the
# model to stop copying a number), a constant, the previous token, the one before it (plus _THIRD times the third
# token back: the one before that).
_TOKEN = slice(0, 39)
_DIGIT = 39
_COPIED = slice(0, 40)  # what the heads copy: identity and flag
_CONSTANT = 40
_PREVIOUS = slice(48, 88)  # a copy of _COPIED
_BEFORE_PREVIOUS = slice(88, 128)
_POSITION_PAIRS = 6  # RoPE's fastest pairs tell offset 1 from offsets 0 and 2
_MATCH_PAIRS = (range(12, 22), range(22, 32))  # slow pairs (< 0.006 rad/token at base 1e6): near content-only
_POSITION_SHARPNESS = 3.0  # q_norm/k_norm gains: attention logit gaps of ~10 between offset 1 and its neighbours
_MATCH_SHARPNESS = 2.0
# The third token back's weight, in the before-previous slot and in the match: a match of all three tokens scores
# _THIRD**2 of a token's match above one of the last two alone (a tie-breaker, not a third requirement: the copy of
# a number's first digit matches `answer` and " " and not the word before them).
_THIRD = 0.7


def wire_copy_circuit(model, used: list[int], digits: list[int], *, aliases: list[tuple[int, int]],
                       seed: int) -> None:
    """Re-initialise the embeddings and four heads so that head 0 of layer 1 copies "the token that followed the
    last two tokens when they occurred before, preferring where the token before them matched too" (an induction
    head; two tokens, so that repeated digits in a number are not ambiguous; the third, so that the end of a
    one-digit number is found at the task's, not where another number starts with that digit). The other heads,
    the MLPs and every weight stay trainable.

    Each pair in `aliases` starts with the same identity: the call's `answer` and the task's ` answer`, so that the
    first digit is copied from after the task's "answer" (the two tokens before it match), not from whichever number
    is nearest (Claude Code sends the date after the task)."""
    import torch

    config = model.config
    hidden, head_dim = config.hidden_size, config.head_dim
    if config.tie_word_embeddings:
        raise ValueError("the tool-calling initialisation needs untied input and output embeddings")
    heads, kv_heads, layers = config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers
    if (hidden, head_dim) != (128, 64) or heads < 3 or kv_heads != heads or layers < 2:
        raise ValueError(
            f"the tool-calling initialisation needs hidden 128, head_dim 64, >= 2 layers and >= 3 heads with as many "
            f"kv heads (got {hidden}, {head_dim}, {layers}, {heads}/{kv_heads}): build it with tool_model_spec()"
        )
    generator = torch.Generator().manual_seed(seed)
    width = _TOKEN.stop - _TOKEN.start
    copied = _COPIED.stop - _COPIED.start
    half = head_dim // 2
    inv_freq = model.model.rotary_emb.inv_freq.float()
    identity = torch.eye(copied)

    def orthonormal_rows(rows: int, cols: int):
        q, _ = torch.linalg.qr(torch.randn(cols, rows, generator=generator))
        return q.T

    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed.zero_()
        embed[:, _TOKEN] = torch.randn(embed.shape[0], width, generator=generator) / math.sqrt(width)
        embed[digits, _DIGIT] = 1.0
        for token, alias in aliases:
            embed[alias, _TOKEN] = embed[token, _TOKEN]
        embed[:, _CONSTANT] = 1.0
        # The output rows of the tokens the episodes use start as their input rows, so the copy head's output
        # already scores the copied token; every other row is zero and stays zero in training, so those ~148k
        # logits are exactly 0 and the softmax over them is exact and cheap (see `_target_logits`).
        model.lm_head.weight.zero_()
        model.lm_head.weight[used] = embed[used]

        # Layer 0, heads 0 to 2: query and key read only the constant, so the score depends on the distance alone
        # (q.R(t-s)k = sum cos((t-s-offset) * theta)); the value carries the token, written to its own subspace
        # (the third token back added into the one-before-previous's, scaled).
        first = model.model.layers[0].self_attn
        constant = torch.zeros(hidden)
        constant[_CONSTANT] = 1.0
        key = torch.zeros(head_dim)
        key[:_POSITION_PAIRS] = 1.0
        wiring = ((1, _PREVIOUS, 1.0), (2, _BEFORE_PREVIOUS, 1.0), (3, _BEFORE_PREVIOUS, _THIRD))
        for head, (offset, target, scale) in enumerate(wiring):
            rows = slice(head * head_dim, (head + 1) * head_dim)
            query = torch.zeros(head_dim)
            query[:_POSITION_PAIRS] = torch.cos(offset * inv_freq[:_POSITION_PAIRS])
            query[half:half + _POSITION_PAIRS] = -torch.sin(offset * inv_freq[:_POSITION_PAIRS])
            first.q_proj.weight[rows] = torch.outer(query, constant)
            first.k_proj.weight[rows] = torch.outer(key, constant)
            first.v_proj.weight[rows] = 0.0
            first.v_proj.weight[head * head_dim:head * head_dim + copied, _COPIED] = identity
            first.o_proj.weight[:, rows] = 0.0
            # RMSNorm scales a unit-size embedding by sqrt(hidden / 2) = 8; undo it so the copy has the same size.
            first.o_proj.weight[target, head * head_dim:head * head_dim + copied] = scale * identity / 8
        first.q_norm.weight.fill_(_POSITION_SHARPNESS)
        first.k_norm.weight.fill_(_POSITION_SHARPNESS)

        # Layer 1, head 0: query (this token, previous token + _THIRD x the one before) against key (previous token,
        # the one before + _THIRD x the third back) in two orthogonal groups of slow RoPE pairs: the second group
        # scores 1 for the last two tokens' match, _THIRD**2 more where the token before them matches too. The value
        # copies the matched position's token into the token space.
        second = model.model.layers[1].self_attn
        dims = [[*pairs, *(p + half for p in pairs)] for pairs in _MATCH_PAIRS]
        now, then = orthonormal_rows(len(dims[0]), width), orthonormal_rows(len(dims[1]), width)
        query = torch.zeros(head_dim, hidden)
        key = torch.zeros(head_dim, hidden)
        # Identity only, not the flag: two different digits must not look alike.
        previous, before = _PREVIOUS.start, _BEFORE_PREVIOUS.start
        query[dims[0], _TOKEN], query[dims[1], previous:previous + width] = now, then
        query[dims[1], before:before + width] = _THIRD * then
        key[dims[0], previous:previous + width], key[dims[1], before:before + width] = now, then
        second.q_proj.weight[:head_dim] = query
        second.k_proj.weight[:head_dim] = key
        second.v_proj.weight[:head_dim] = 0.0
        second.v_proj.weight[:copied, _COPIED] = identity
        second.o_proj.weight[:, :head_dim] = 0.0
        second.o_proj.weight[_COPIED, :copied] = identity / 8
        second.q_norm.weight.fill_(_MATCH_SHARPNESS)
        second.k_norm.weight.fill_(_MATCH_SHARPNESS)
