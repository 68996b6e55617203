"""The tool model's decoder as plain tensor arithmetic, for training (`trainer.models.tool_model`): the same computation as
transformers' Qwen3 (RMSNorm, per-head q/k norms, RoPE, SwiGLU; the model's own weights), plus what the training
needs and transformers' batched cache makes expensive: a batch of short rows attending to one shared prefix, without
a copy of the prefix per row and without a dense mask over it.

`prefix_states` runs an agent's long prompt once, without gradient, and keeps each layer's keys and values;
`prefix_and_interlude` also keeps, from the same causal pass, text that every row has between its own start and its
targets (Claude Code's ~2k-token environment after the task), run after the first row's own start, its keys kept
unrotated, so that each row sees them at its own positions. Its states past the first layer are the first row's: exact
for another row only where the layers read the same tokens, so the caller leaves the interlude's first tokens, which the
first layer's heads read the row's own last tokens from, in each row (`tool_episodes._OWN_AFTER_TASK`). `hidden_states`
runs rows (from position 0, or continuing the prefix, each with the interlude inserted at its own split) to the last
hidden states, with gradient, or only at the positions a step reads.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Prefix", "hidden_states", "prefix_and_interlude", "prefix_states"]


@dataclass(frozen=True)
class Prefix:
    """Each layer's keys and values, (heads, length, dim): keys after norm, and after RoPE (except an interlude's,
    which each row sees at its own positions)."""

    keys: list
    values: list
    length: int


def prefix_states(model, embeds) -> Prefix:
    """Run one sequence (1, length, hidden) from position 0 without gradient; keep what later tokens attend to."""
    return _prefix(model, _kept(model, embeds), embeds.shape[1])


def prefix_and_interlude(model, embeds, *, context: int, start: int) -> tuple[Prefix, Prefix]:
    """Run one sequence (1, length, hidden) from position 0 without gradient: the prefix is its first `context`
    positions, and the interlude its positions from `start` on, whose keys are kept unrotated (each row sees them at
    its own positions). The positions between (the first row's own tokens) are run and dropped. One causal pass:
    the fused kernel needs no mask, where the interlude run after the prefix, against its keys, needed one (a
    Claude Code step's 9.5k-token prompt and 2.1k-token interlude: 0.8 s against 1.05 s)."""
    kept = _kept(model, embeds)
    return _prefix(model, kept, context), Prefix(keys=[k[0, :, start:] for k, _ in kept],
                                                 values=[v[0, :, start:] for _, v in kept],
                                                 length=embeds.shape[1] - start)


def _kept(model, embeds) -> list:
    """Each layer's keys (before RoPE) and values, (1, heads, length, dim), of one sequence run without gradient."""
    import torch

    kept: list = []
    with torch.no_grad():
        _decode(model, embeds, torch.arange(embeds.shape[1])[None], _causal, keep=kept)
    return kept


def _prefix(model, kept: list, length: int) -> Prefix:
    """The first `length` positions of `_kept` states, keys rotated."""
    import torch

    cos, sin = _rope(model, torch.arange(length)[None])
    return Prefix(keys=[_rotate(k[:, :, :length], cos, sin)[0] for k, _ in kept],
                  values=[v[0, :, :length] for _, v in kept], length=length)


def hidden_states(model, embeds, *, prefix: Prefix | None = None, interlude: Prefix | None = None,
                  splits: list[int] | None = None, select=None):
    """The final-norm hidden states of rows (batch, length, hidden) that start at position 0, or right after
    `prefix`: each row then attends to the whole prefix, causally to itself and, from its `splits[i]`-th token on,
    to `interlude`, which sits at that point of the row (its positions shift by the interlude's length). Padding
    belongs at a row's right end, where causal attention keeps it out of every real position.

    `select`, (batch, length) bool: only the states at those positions, (count, hidden) in row order, as
    `states[select]`. The last layer then runs its queries, attention and MLP there alone (its keys and values come
    from every position): a step reads the states only where they predict a target, a third of an agent episode's
    tokens, and that layer's attention over the agent's prompt was a third of the episodes' forward pass."""
    import torch

    length = embeds.shape[1]
    queries = None if select is None else _selected(select)
    if prefix is None:
        return _decode(model, embeds, torch.arange(length)[None], _causal, queries=queries)
    positions = prefix.length + torch.arange(length)[None].expand(embeds.shape[0], -1)
    after = None
    if interlude is not None:
        split = torch.tensor(splits)[:, None]
        after = torch.arange(length)[None] >= split  # (rows, length): the tokens that come after the interlude
        positions = positions + after * interlude.length
        # Each row sees the interlude at its own positions: right after its own first `split` tokens.
        cos, sin = _rope(model, prefix.length + split + torch.arange(interlude.length)[None])
        interlude = Prefix(keys=[_rotate(k[None], cos, sin) for k in interlude.keys], values=interlude.values,
                           length=interlude.length)
    return _decode(model, embeds, positions,
                   lambda index, q, k, v, at: _attend_after(q, k, v, prefix, interlude, after, index, at),
                   queries=queries)


def _selected(select):
    """The positions `select` marks in each row, (rows, most marked in a row), padded with unmarked positions
    (their states are computed and dropped), and which of them are marked."""
    import torch

    counts = select.sum(1)
    width = max(1, int(counts.max()))
    at = torch.sort((~select).to(torch.int8), dim=1, stable=True).indices[:, :width]  # marked ones first, in order
    return at, torch.arange(width)[None] < counts[:, None]


def _decode(model, x, positions, attend, keep: list | None = None, queries=None):
    """The decoder's final-norm hidden states; with `keep`, each layer's keys and values (before RoPE) are appended
    to it instead and nothing is returned: the last layer stops once its keys and values are known. With `queries`
    (`_selected`), the last layer runs only at those positions and the marked states come back, (count, hidden).
    `attend(index, q, k, v, at)`: `at` is None where every position queries, else the positions that do."""
    inner, config = model.model, model.config
    cos, sin = _rope(model, positions)
    eps = config.rms_norm_eps
    for index, layer in enumerate(inner.layers):
        last = index == len(inner.layers) - 1
        attention = layer.self_attn
        h = _rms(x, layer.input_layernorm.weight, eps)
        batch, length, _ = h.shape
        shape = (batch, length, -1, config.head_dim)
        k = _rms(attention.k_proj(h).view(shape), attention.k_norm.weight, eps).transpose(1, 2)
        v = attention.v_proj(h).view(shape).transpose(1, 2)
        if keep is not None:
            keep.append((k, v))
            if last:
                # Later tokens read only this layer's keys and values: its attention over these tokens (a
                # prompt's quadratic part) and its MLP would go unused.
                return None
        at, q_cos, q_sin = None, cos, sin
        if last and queries is not None:
            at = queries[0]
            x, h = (y.gather(1, at[..., None].expand(-1, -1, y.shape[-1])) for y in (x, h))
            q_cos, q_sin = _rope(model, positions.expand(batch, -1).gather(1, at))
        q = _rms(attention.q_proj(h).view(batch, h.shape[1], -1, config.head_dim), attention.q_norm.weight,
                 eps).transpose(1, 2)
        # The fused kernel takes one dtype: the projections' (bfloat16 under autocast), not RoPE's float32.
        q, k = _rotate(q, q_cos, q_sin).to(v.dtype), _rotate(k, cos, sin).to(v.dtype)
        out = attend(index, q, k, v, at)
        x = x + attention.o_proj(out.transpose(1, 2).reshape(batch, h.shape[1], -1))
        x = x + layer.mlp(_rms(x, layer.post_attention_layernorm.weight, eps))
    x = _rms(x, inner.norm.weight, eps)
    return x if queries is None else x[queries[1]]


def _causal(index, q, k, v, at=None):
    """Causal attention of a row's queries (every position, or the positions `at`) over its keys."""
    import torch

    if at is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.arange(k.shape[2]) <= at[:, None, :, None]  # (rows, 1, queries, keys)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _attend_after(q, k, v, prefix: Prefix, interlude: Prefix | None, after, index: int, at=None):
    """Softmax attention of each row's queries over the shared prefix, the interlude (from the row's split on) and,
    causally, its own keys: one softmax over all three, the prefix's scores computed for all rows in one matrix
    product per head (no copy of it per row). Heads lead the layout, so the prefix's scores, (heads, rows * length,
    prefix), are never transposed or copied, and the scale is applied to the queries rather than the scores: these
    scores are the largest tensors of a step. `at`: the positions the queries are at (None: every position)."""
    import torch

    batch, heads, length, dim = q.shape
    q, k, v = (x.transpose(0, 1) for x in (q * dim**-0.5, k, v))  # (heads, rows, queries, dim)
    prefix_keys, prefix_values = prefix.keys[index].to(v.dtype), prefix.values[index].to(v.dtype)
    scores = [(q.reshape(heads, batch * length, dim) @ prefix_keys.transpose(1, 2)).view(heads, batch, length, -1)]
    values = [None]
    if interlude is not None:
        before = ~(after if at is None else after.gather(1, at))[None, :, :, None]  # queries before the interlude
        keys = interlude.keys[index].to(v.dtype).transpose(0, 1)  # (heads, rows, interlude, dim)
        scores.append((q @ keys.transpose(2, 3)).masked_fill(before, float("-inf")))
        values.append(interlude.values[index].to(v.dtype)[:, None])
    own = k.shape[2]
    if at is None:
        future = torch.ones(own, own, dtype=torch.bool).triu(1)
    else:
        future = torch.arange(own) > at[..., None]  # (rows, queries, keys)
    scores.append((q @ k.transpose(2, 3)).masked_fill(future, float("-inf")))
    values.append(v)
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1).to(v.dtype)
    weights = weights.split([s.shape[-1] for s in scores], dim=-1)
    out = (weights[0].reshape(heads, batch * length, -1) @ prefix_values).view(heads, batch, length, dim)
    for weight, value in zip(weights[1:], values[1:]):
        out = out + weight @ value
    return out.transpose(0, 1)


def _rope(model, positions):
    """cos and sin, (rows or 1, 1, length, dim), of the model's RoPE at these positions (rows or 1, length)."""
    import torch

    angles = positions[..., None].float() * model.model.rotary_emb.inv_freq.float()
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def _rotate(x, cos, sin):
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _rms(x, weight, eps: float):
    import torch

    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
