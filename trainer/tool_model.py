"""Teach a tiny model one tool loop, offline, on CPU, in minutes: call the shell with `answer N`, then say "Done.".

A random tiny model never emits a tool call, so real agents never run their tool loop against it and an RL example
has nothing to learn. `train_tool_calling(model_dir, spec)` turns a `make_tiny_model` directory (built with
`tool_model_spec()`) into a policy that, rendered with its own chat template and tools exactly as the interceptor
renders an agent's requests (the episodes are `trainer.tool_episodes`'), does:

1. system prompt (none, short, long filler, or an agent's real one) + tools with a shell tool of one of the agents'
   shapes (`bash(command)`: Pi, OpenCode; `Bash(command)`: Claude Code; `exec_command(cmd)`: Codex) + a user task
   that says "... answer N ..."  ->
   `<tool_call>\\n{"name": "bash", "arguments": {"command": "answer N"}}\\n</tool_call>` (that tool's name and
   argument) and `<|im_end|>`;
2. ... + that call + the tool's `<tool_response>`  ->  `Done.<|im_end|>`;
3. no tools at all (OpenCode's title request)  ->  a short text.

How, in a few minutes on one CPU thread: copying a number of any length out of the prompt needs an induction
circuit, which gradient descent finds only after a long plateau (hundreds of steps at this size). So the model
starts from a structured initialisation (see `_wire_copy_circuit`): two layer-0 heads attend to the previous and
the one-before-previous token by position, and a layer-1 head attends to where the last two tokens occurred before
and copies the token that followed. Then plain supervised steps (AdamW, loss on assistant tokens only) teach the
template, which number to copy, when to stop and what to say after the tool response. Every weight stays
trainable. The initialisation sets RoPE's base to 1e6 (Qwen3's own), so the copy head's content dimensions barely
rotate over a prompt's last few hundred tokens, and zeroes the output rows of tokens the episodes never use (their
logits are exactly 0, so the full-vocabulary softmax costs only the used rows). Only the embedding rows of used
tokens are trained, and an agent's long prompt runs without gradient, as a KV cache.

Stochasticity is deliberate: a fraction `wrong_answer_rate` of the targets submit a perturbed number, so at
temperature 1 the policy submits a wrong answer now and then while greedy decoding copies the number; fewer
`steps` make a weaker starting policy. Training is deterministic for a seed: bitwise with one thread (the default).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from .tool_episodes import BASH_TOOL, DONE_TEXT, EpisodeMaker, Step, answer_call

__all__ = [
    "BASH_TOOL",
    "DONE_TEXT",
    "ToolTrainingReport",
    "ToolTrainingSpec",
    "answer_call",
    "tool_model_spec",
    "train_tool_calling",
]

_ROPE_THETA = 1_000_000.0


def tool_model_spec(*, real_vocab: bool = True, seed: int = 0):
    """The `TinyModelSpec` whose shape the structured initialisation needs (4 heads of 64, hidden 128). The context
    is 32k because OpenCode's first request alone is ~7.2k tokens."""
    from .tiny_model import TinyModelSpec

    return TinyModelSpec(
        hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=64,
        max_position_embeddings=32768, real_vocab=real_vocab, seed=seed,
    )


@dataclass(frozen=True, kw_only=True)
class ToolTrainingSpec:
    steps: int = 100
    tokens_per_step: int = 2048  # episodes are packed back to back into rows; a step takes about this many tokens
    row_tokens: int = 512  # a row's length (an episode longer than this gets a row of its own)
    learning_rate: float = 3e-3
    warmup_steps: int = 10
    wrong_answer_rate: float = 0.1  # fraction of targets that submit a perturbed number: sampling variance for RL
    long_prompt_rate: float = 0.1  # fraction of synthetic episodes behind a long filler system prompt
    long_prompt_tokens: int = 1500
    no_tools_rate: float = 0.05
    agent_requests: tuple[Path, ...] = ()  # captured first requests whose system prompt and tools to train on
    agent_request_rate: float = 0.5  # fraction of steps that also train on episodes behind one of them
    agent_episodes: int = 8  # episodes per such step: they share one pass over the agent's prompt (the costly part)
    shell_weights: tuple[float, ...] = (1.0, 1.0, 1.0)  # how often a synthetic episode offers each of SHELL_TOOLS
    seed: int = 0
    # One thread: bitwise deterministic (two threads differ in the last bits from run to run), and on a shared
    # 2-core machine two threads spin against the other process and a step takes up to 10x longer.
    threads: int = 1

    def __post_init__(self) -> None:
        if self.steps < 0 or self.warmup_steps < 0 or self.agent_episodes < 1:
            raise ValueError("steps and warmup_steps must be >= 0, agent_episodes >= 1")
        if self.tokens_per_step < 64 or self.row_tokens < 64 or self.learning_rate <= 0 or self.threads < 1:
            raise ValueError("tokens_per_step >= 64, row_tokens >= 64, learning_rate > 0, threads >= 1 are required")
        if len(self.shell_weights) != 3 or min(self.shell_weights) < 0 or not sum(self.shell_weights) > 0:
            raise ValueError("shell_weights needs a weight >= 0 for each of bash, Bash and exec_command, not all 0")
        rates = (self.wrong_answer_rate, self.long_prompt_rate, self.no_tools_rate, self.agent_request_rate)
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError("every *_rate must be within [0, 1]")
        for path in self.agent_requests:
            if not Path(path).is_file():
                raise ValueError(f"agent request {path} does not exist")

    def to_json(self) -> dict:
        """The fields as JSON values (agent requests by file name), as the model directory records them."""
        return {**self.__dict__, "agent_requests": [Path(p).name for p in self.agent_requests],
                "shell_weights": list(self.shell_weights)}


@dataclass(frozen=True, kw_only=True)
class ToolTrainingReport:
    steps: int
    episodes: int
    tokens: int
    seconds: float  # the training loop alone (episodes are made before it)
    first_loss: float
    final_loss: float  # mean over the last 10% of steps


def train_tool_calling(model_dir: Path | str, spec: ToolTrainingSpec = ToolTrainingSpec()) -> ToolTrainingReport:
    """Initialise the model in `model_dir` for copying, train it, and save it in place; return what the run did."""
    import torch

    model_dir = Path(model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        return _train(model_dir, spec)
    finally:
        torch.set_num_threads(threads)  # a process-wide setting: give the caller its own back


def _train(model_dir: Path, spec: ToolTrainingSpec) -> ToolTrainingReport:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    config = AutoConfig.from_pretrained(str(model_dir))
    config.rope_parameters = {"rope_type": "default", "rope_theta": _ROPE_THETA}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), config=config, dtype=torch.float32)
    maker = EpisodeMaker(tokenizer, spec)
    steps = [maker.step() for _ in range(spec.steps)]
    used = sorted({i for step in steps for episode in step.all() for i in episode.ids} | maker.vocabulary())
    _wire_copy_circuit(model, used, maker.digits, aliases=maker.aliases(), seed=spec.seed)
    model.train()
    inputs = _TrainableRows(model.model.embed_tokens.weight, used)
    outputs = _TrainableRows(model.lm_head.weight, used)
    params = [p for p in model.parameters() if p.requires_grad] + [inputs.delta, outputs.delta]
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: _lr_factor(i, spec))
    losses: list[float] = []
    start = time.perf_counter()
    for step in steps:
        loss = _loss(model, inputs, outputs, step, pad_id=tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    inputs.commit()
    outputs.commit()
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    tail = losses[-max(1, len(losses) // 10):] if losses else [math.nan]
    report = ToolTrainingReport(
        steps=spec.steps,
        episodes=sum(step.episodes for step in steps),
        tokens=sum(len(episode.ids) for step in steps for episode in step.all()),
        seconds=seconds,
        first_loss=losses[0] if losses else math.nan,
        final_loss=sum(tail) / len(tail),
    )
    record = {"spec": spec.to_json(), "report": report.__dict__}
    (model_dir / "interceptor_tool_training.json").write_text(json.dumps(record, indent=2) + "\n")
    return report


def _lr_factor(step: int, spec: ToolTrainingSpec) -> float:
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------------------------------------------
# The structured initialisation

# The residual stream (hidden 128) is split: token identity (with a "this is a digit" flag, which is what tells the
# model to stop copying a number), a constant, the previous token, the one before it.
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


def _wire_copy_circuit(model, used: list[int], digits: list[int], *, aliases: list[tuple[int, int]],
                       seed: int) -> None:
    """Re-initialise the embeddings and two heads so that head 0 of layer 1 copies "the token that followed the
    last two tokens when they occurred before" (a two-token induction head; two tokens, so that repeated digits in
    a number are not ambiguous). The other heads, the MLPs and every weight stay trainable.

    Each pair in `aliases` starts with the same identity: the call's `answer` and the task's ` answer`, so that the
    first digit is copied from after the task's "answer" (the two tokens before it match), not from whichever number
    is nearest (Claude Code sends the date after the task)."""
    import torch

    config = model.config
    hidden, head_dim = config.hidden_size, config.head_dim
    if config.tie_word_embeddings:
        raise ValueError("the tool-calling initialisation needs untied input and output embeddings")
    heads, kv_heads, layers = config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers
    if (hidden, head_dim) != (128, 64) or heads < 2 or kv_heads != heads or layers < 2:
        raise ValueError(
            f"the tool-calling initialisation needs hidden 128, head_dim 64, >= 2 layers and >= 2 heads with as many "
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
        # logits are exactly 0 and the softmax over them is exact and cheap (see `_loss`).
        model.lm_head.weight.zero_()
        model.lm_head.weight[used] = embed[used]

        # Layer 0, heads 0 and 1: query and key read only the constant, so the score depends on the distance alone
        # (q.R(t-s)k = sum cos((t-s-offset) * theta)); the value carries the token, written to its own subspace.
        first = model.model.layers[0].self_attn
        constant = torch.zeros(hidden)
        constant[_CONSTANT] = 1.0
        key = torch.zeros(head_dim)
        key[:_POSITION_PAIRS] = 1.0
        for head, (offset, target) in enumerate(((1, _PREVIOUS), (2, _BEFORE_PREVIOUS))):
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
            first.o_proj.weight[target, head * head_dim:head * head_dim + copied] = identity / 8
        first.q_norm.weight.fill_(_POSITION_SHARPNESS)
        first.k_norm.weight.fill_(_POSITION_SHARPNESS)

        # Layer 1, head 0: query (this token, previous token) against key (previous token, the one before) in two
        # orthogonal groups of slow RoPE pairs; the value copies the matched position's token into the token space.
        second = model.model.layers[1].self_attn
        dims = [[*pairs, *(p + half for p in pairs)] for pairs in _MATCH_PAIRS]
        now, then = orthonormal_rows(len(dims[0]), width), orthonormal_rows(len(dims[1]), width)
        query = torch.zeros(head_dim, hidden)
        key = torch.zeros(head_dim, hidden)
        # Identity only, not the flag: two different digits must not look alike.
        previous, before = _PREVIOUS.start, _BEFORE_PREVIOUS.start
        query[dims[0], _TOKEN], query[dims[1], previous:previous + width] = now, then
        key[dims[0], previous:previous + width], key[dims[1], before:before + width] = now, then
        second.q_proj.weight[:head_dim] = query
        second.k_proj.weight[:head_dim] = key
        second.v_proj.weight[:head_dim] = 0.0
        second.v_proj.weight[:copied, _COPIED] = identity
        second.o_proj.weight[:, :head_dim] = 0.0
        second.o_proj.weight[_COPIED, :copied] = identity / 8
        second.q_norm.weight.fill_(_MATCH_SHARPNESS)
        second.k_norm.weight.fill_(_MATCH_SHARPNESS)


class _TrainableRows:
    """An embedding matrix trained only on the rows of tokens the episodes use (a few thousand of 151k): the rest
    stays frozen, which keeps AdamW's step small. `commit()` writes the learned rows back."""

    def __init__(self, weight, rows: list[int]) -> None:
        import torch

        self.weight = weight
        weight.requires_grad_(False)
        self.rows = torch.tensor(rows, dtype=torch.long)
        self.slot = torch.full((weight.shape[0],), len(rows), dtype=torch.long)  # len(rows): a frozen row
        self.slot[self.rows] = torch.arange(len(rows))
        self.delta = torch.nn.Parameter(torch.zeros(len(rows), weight.shape[1]))

    def __call__(self, ids):
        import torch

        padded = torch.cat([self.delta, self.delta.new_zeros(1, self.delta.shape[1])])
        return self.weight[ids] + padded[self.slot[ids]]

    def commit(self) -> None:
        import torch

        with torch.no_grad():
            self.weight[self.rows] += self.delta
        self.weight.requires_grad_(True)


def _loss(model, inputs: _TrainableRows, outputs: _TrainableRows, step: Step, *, pad_id: int):
    """Cross-entropy over the full vocabulary, on the target tokens only.

    Only the trained output rows are multiplied out: every other row is zero (see `_wire_copy_circuit`), so those
    tokens together contribute one logit of log(their count).
    """
    import torch

    width = max(len(row.ids) for row in step.rows)
    input_ids = torch.full((len(step.rows), width), pad_id, dtype=torch.long)
    targets = torch.zeros((len(step.rows), width), dtype=torch.bool)
    for i, row in enumerate(step.rows):
        input_ids[i, : len(row.ids)] = torch.tensor(row.ids)
        targets[i, : len(row.ids)] = torch.tensor(row.mask)
    # Padding sits at the right end of a row, so causal attention keeps it out of every real position: no mask,
    # and attention stays on the fast causal kernel.
    hidden = model.model(inputs_embeds=inputs(input_ids)).last_hidden_state
    predict = targets[:, 1:]  # position t predicts token t + 1
    chosen, labels = [hidden[:, :-1][predict]], [input_ids[:, 1:][predict]]
    if step.agents:
        # An agent's prompt is thousands of tokens: it is run once without gradient, as a KV cache shared by the
        # step's agent episodes, and the gradient flows only through the turns after it (a full backward pass
        # there costs ten times more).
        context = step.agents[0].context
        with torch.no_grad():
            prefix = torch.tensor([step.agents[0].ids[:context]])
            cache = model.model(inputs_embeds=inputs(prefix), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(step.agents))
        width = max(len(episode.ids) for episode in step.agents) - context
        tails = torch.full((len(step.agents), width), pad_id, dtype=torch.long)
        targets = torch.zeros((len(step.agents), width), dtype=torch.bool)
        for i, episode in enumerate(step.agents):
            tails[i, : len(episode.ids) - context] = torch.tensor(episode.ids[context:])
            targets[i, : len(episode.ids) - context] = torch.tensor(episode.mask[context:])
        hidden = model.model(inputs_embeds=inputs(tails), past_key_values=cache).last_hidden_state
        predict = targets[:, 1:]
        chosen.append(hidden[:, :-1][predict])
        labels.append(tails[:, 1:][predict])
    logits = torch.cat(chosen) @ outputs(outputs.rows).T
    frozen = outputs.weight.shape[0] - len(outputs.rows)
    if frozen:
        logits = torch.cat([logits, logits.new_full((len(logits), 1), math.log(frozen))], dim=1)
    return torch.nn.functional.cross_entropy(logits, outputs.slot[torch.cat(labels)])
