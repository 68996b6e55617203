"""Teach a tiny model one tool loop, offline, on CPU, in about a minute: call the shell with `answer N`, then "Done.".

A random tiny model never emits a tool call, so real agents never run their tool loop against it and an RL example
has nothing to learn. `train_tool_calling(model_dir, spec)` turns a `make_tiny_model` directory (built with
`tool_model_spec()`) into a policy that, rendered with its own chat template and tools exactly as the interceptor
renders an agent's requests (the episodes are `trainer.models.tool_episodes`'), does:

1. system prompt (none, short, long filler, or an agent's real one) + tools with a shell tool of one of the agents'
   shapes (`bash(command)`: Pi, OpenCode; `Bash(command)`: Claude Code; `exec_command(cmd)`: Codex) + a user task
   that says "... answer N ..."  ->
   `<tool_call>\\n{"name": "bash", "arguments": {"command": "answer N"}}\\n</tool_call>` (that tool's name and
   argument) and `<|im_end|>`;
2. ... + that call + the tool's `<tool_response>`  ->  `Done.<|im_end|>`;
3. no tools at all (OpenCode's title request)  ->  a short text.

How, in about a minute on two CPU threads: copying a number of any length out of the prompt needs an induction circuit,
which gradient descent finds only after a long plateau (hundreds of steps at this size). So the model starts from a
structured initialisation (`trainer.models.copy_circuit`): three layer-0 heads attend to the previous, the one-before-previous
and the third token back by position, and a layer-1 head attends to where the last two tokens occurred before (the third
back breaking ties) and copies the token that followed. Then plain supervised steps (AdamW, loss on assistant tokens
only) teach the template, which number to copy, when to stop and what to say after the tool response. Every weight stays
trainable. The initialisation sets RoPE's base to 1e6 (Qwen3's own), so the copy head's content dimensions barely rotate
over a prompt's last few hundred tokens, and zeroes the output rows of tokens the episodes never use (their logits are
exactly 0, so the full-vocabulary softmax costs only the used rows). Only the embedding rows of used tokens are trained.

Where the time goes, and how the steps take well under a minute (`trainer.models.tool_forward` runs the decoder): with
`bfloat16` the matrix products run in bfloat16 (CPU autocast: AMX or AVX512-BF16 make them several times faster than
float32; by default only on such a CPU, `precision.cpu_multiplies_bf16`: without them bf16 is emulated, 8.5x slower than
float32), while weights, optimizer and the saved model stay float32. An agent's prompt (1.4k to 9.5k tokens) runs once
per step without gradient, only as far as its last layer's keys and values (that layer's attention over the prompt would
go unused), and the step's episodes attend to them without a copy per episode; so does the text they share after their
tasks (Claude Code's ~2.1k-token environment), run in the same causal pass after the first episode's task and seen by
each episode at its own positions, but for its first few tokens, which each episode runs itself
(`tool_episodes._OWN_AFTER_TASK`: there the copy head reads where a task's number ends). The episodes' last layer runs
only where a state predicts a target (a third of their tokens; its keys and values still come from every position). Each
episode's own task keeps its gradient: without it the model learnt to copy the tool name from a shell-like word in the
prompt (Pi's "Bash command to execute", Claude Code's "Shell: bash") instead of from the offered tool; for the same
reason synthetic prompts name shells in prose (`Shell: bash`, `<shell>zsh</shell>`), often not the offered one. Agent
steps are evenly spaced and take the agents in rounds (`agent_weights`): drawn at random, one agent could go unseen for
the last stretch of training and the tool name its prompt gets flipped (measured: Pi's `bash` became `Bash`, Codex's
`exec_command` became `bash`). Synthetic rows run one at a time, unpadded (a long-prompt row is 3x the others). The
steps keep the pages they free for the next step (`trainer.models.heap`): glibc's defaults faulted them in again, 18 s of
system time in a 62 s build.

The steps alone leave each agent's call a few logits ahead of the next best name or argument (Claude Code's `Bash`
against its environment's "Shell: bash", Pi's `bash` against its "Bash command", Codex's `cmd` against `command`),
and which agent fell behind changed with the machine's bfloat16 numerics (the same recipe wrote `bash` for Claude Code
in 16 of 16 prompts on one machine and `Bash` on another). So the build checks itself: episodes behind each
agent's prompt, teacher-forced in float32 as the model is served and each run whole (no text shared after its task:
`tool_check._whole`), must have every target token but the digits lead
the next best by `check_margin`; an agent that falls short gets one more step behind its prompt, for up to
`check_rounds` rounds. The check's episodes are drawn once, so a round's margins differ from the last round's by
what the steps changed, not by which episodes were drawn. After a round only what fell short is measured again, and
every other check once that passes (`trainer.models.tool_check`: on an AMX CPU the same corrective steps as measuring all
after every round, 82 s of training against 90 s). With `check_responses` (the embedded default) the check also
covers "Done." after each tool response in the plainest request (the bash tool, "Submit the answer N."): an
fp32 build that passed every agent's check called the tool again after an empty response to a one-digit task (-4.0
logits), and a response that falls short gets a step of such episodes ending in it (steps of the usual synthetic
episodes did not mend it in 16 rounds). With `check_first_turns` (on in the embedded default) it covers whether the
first turn calls a tool at all in synthetic requests like the steps' (a build whose every agent passed said "Done."
at once for 6 of 24 held-out numbers behind a read tool and the bash tool): short, it gets a step of synthetic
episodes. Those episodes have their own seed, so a build whose check passes is the build it was. The report records
the corrective steps, each agent's final margin, the responses' smallest and the first calls'.

Stochasticity is deliberate: a fraction `wrong_answer_rate` of the targets submit a perturbed number, so at
temperature 1 the policy submits a wrong answer now and then while greedy decoding copies the number; fewer
`steps` make a weaker starting policy. Training is deterministic: bitwise the same for a seed and a thread count
(deterministic kernels; two threads by default, ~2.2x one here).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.models.copy_circuit import ROPE_THETA, wire_copy_circuit
from trainer.models.heap import retained_heap
from trainer.models.tool_check import BuildChecks, corrected
from trainer.models.tool_episodes import BASH_TOOL, DONE_TEXT, EpisodeMaker, answer_call
from trainer.models.tool_forward import hidden_states, prefix_and_interlude, prefix_states
from trainer.models.tool_steps import Episode, Step
from trainer.models.trainable_rows import TrainableRows
from trainer.rl.precision import cpu_multiplies_bf16

if TYPE_CHECKING:
    from trainer.models.episode_process import EpisodeProcess

__all__ = [
    "BASH_TOOL",
    "DONE_TEXT",
    "ToolTrainingReport",
    "ToolTrainingSpec",
    "answer_call",
    "tool_model_spec",
    "train_tool_calling",
]



def tool_model_spec(*, real_vocab: bool = True, seed: int = 0):
    """The `TinyModelSpec` whose shape the structured initialisation needs (4 heads of 64, hidden 128). The context
    is 32k because OpenCode's first request alone is ~7.2k tokens."""
    from trainer.models.tiny_model import TinyModelSpec

    return TinyModelSpec(
        hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=64,
        max_position_embeddings=32768, real_vocab=real_vocab, seed=seed,
    )


@dataclass(frozen=True, kw_only=True)
class ToolTrainingSpec:
    steps: int = 72
    tokens_per_step: int = 1024  # episodes are packed back to back into rows; a step takes about this many tokens
    row_tokens: int = 512  # a row's length (an episode longer than this gets a row of its own)
    learning_rate: float = 3e-3
    warmup_steps: int = 8
    wrong_answer_rate: float = 0.1  # fraction of targets that submit a perturbed number: sampling variance for RL
    long_prompt_rate: float = 0.1  # fraction of synthetic episodes behind a long filler system prompt
    long_prompt_tokens: int = 1500
    no_tools_rate: float = 0.05
    agent_requests: tuple[Path, ...] = ()  # captured first requests whose system prompt and tools to train on
    agent_request_rate: float = 0.45  # fraction of steps that also train on episodes behind one of them
    agent_episodes: int = 10  # episodes per such step: they share one pass over the agent's prompt (the costly part)
    agent_weights: tuple[int, ...] = ()  # how many times per round each of agent_requests is drawn (none: once)
    # After the steps, each agent's prompt is checked: `check_episodes` episodes behind it, drawn once and
    # teacher-forced again after each round that corrected it (all of them once it passes), must have every target
    # token lead the next best by `check_margin` logits (what greedy decoding writes, with room for another machine's
    # numerics). An agent that falls short gets one more step behind its prompt (fresh episodes), up to
    # `check_rounds` times.
    check_rounds: int = 16
    check_episodes: int = 2
    check_margin: float = 1.0
    check_learning_rate: float = 3e-4  # a corrective step's (the main steps' cosine ends at 0.1 of `learning_rate`)
    # Also check "Done." after each tool response (`tool_texts.TOOL_OUTPUTS`) in the plainest request, the task and
    # the bash tool: a response after which it falls short gets a step of such episodes ending in it.
    check_responses: bool = False
    # Also check the first call in `check_first_turns` synthetic requests like the ones the steps draw (a shell tool
    # alone or among others, the usual system prompts): short, they get a step of synthetic episodes. 0: not checked.
    check_first_turns: int = 0
    shell_weights: tuple[float, ...] = (1.0, 1.0, 1.0)  # how often a synthetic episode offers each of SHELL_TOOLS
    # Matrix products in bfloat16 (CPU autocast; weights and optimizer stay float32). None: where the CPU has bf16
    # matrix units (`precision.cpu_multiplies_bf16`), else float32; the report says which the build used.
    bfloat16: bool | None = None
    seed: int = 0
    # Two threads: a step ~2.2x faster than one on this 2-core machine. A build is bitwise the same for a seed and a
    # thread count (deterministic kernels), not across thread counts. Where another process keeps the cores busy,
    # two threads spin against it: `threads=1` is the choice there.
    threads: int = 2

    def __post_init__(self) -> None:
        if self.steps < 0 or self.warmup_steps < 0 or self.agent_episodes < 1:
            raise ValueError("steps and warmup_steps must be >= 0, agent_episodes >= 1")
        if (self.check_rounds < 0 or self.check_episodes < 1 or self.check_margin < 0 or self.check_learning_rate <= 0
                or self.check_first_turns < 0):
            raise ValueError("check_rounds >= 0, check_episodes >= 1, check_margin >= 0, check_learning_rate > 0 and "
                             "check_first_turns >= 0 are required")
        if self.tokens_per_step < 64 or self.row_tokens < 64 or self.learning_rate <= 0 or self.threads < 1:
            raise ValueError("tokens_per_step >= 64, row_tokens >= 64, learning_rate > 0, threads >= 1 are required")
        if len(self.shell_weights) != 3 or min(self.shell_weights) < 0 or not sum(self.shell_weights) > 0:
            raise ValueError("shell_weights needs a weight >= 0 for each of bash, Bash and exec_command, not all 0")
        rates = (self.wrong_answer_rate, self.long_prompt_rate, self.no_tools_rate, self.agent_request_rate)
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError("every *_rate must be within [0, 1]")
        if self.agent_weights and (len(self.agent_weights) != len(self.agent_requests)
                                   or min(self.agent_weights) < 0 or not sum(self.agent_weights) > 0):
            raise ValueError("agent_weights needs a count >= 0 for each of agent_requests, not all 0")
        for path in self.agent_requests:
            if not Path(path).is_file():
                raise ValueError(f"agent request {path} does not exist")

    def to_json(self) -> dict:
        """The fields as JSON values (agent requests by file name), as the model directory records them."""
        return {**self.__dict__, "agent_requests": [Path(p).name for p in self.agent_requests],
                "shell_weights": list(self.shell_weights), "agent_weights": list(self.agent_weights)}


@dataclass(frozen=True, kw_only=True)
class ToolTrainingReport:
    steps: int
    episodes: int
    tokens: int
    seconds: float  # the training loop alone (episodes are made before it)
    first_loss: float
    final_loss: float  # mean over the last 10% of steps
    corrective_steps: int = 0  # steps the check added after `steps`
    # each agent's smallest target margin at the end (by capture name): below `check_margin`, the check gave up
    agent_margins: dict[str, float] = dataclasses.field(default_factory=dict)
    response_margin: float | None = None  # the smallest margin of "Done." after a tool response (when checked)
    first_turn_margin: float | None = None  # the smallest lead of `<tool_call>` at the first turns (when checked)
    bfloat16: bool = False  # whether the matrix products ran in bfloat16


def train_tool_calling(model_dir: Path | str, spec: ToolTrainingSpec = ToolTrainingSpec(), *,
                       tokenizer=None, episodes: EpisodeMaker | EpisodeProcess | None = None) -> ToolTrainingReport:
    """Initialise the model in `model_dir` for copying, train it, and save it in place; return what the run did.
    `tokenizer`: the one saved in `model_dir`, when the caller holds it (loading the real vocabulary's takes ~1 s).
    `episodes`: where the episodes come from, an `EpisodeMaker` for this spec or what answers as one (the embedded
    default's build draws them in a process of its own, `trainer.models.episode_process`); none: one over `tokenizer`."""
    import torch

    model_dir = Path(model_dir)
    threads = torch.get_num_threads()
    deterministic, warn_only = (torch.are_deterministic_algorithms_enabled(),
                                torch.is_deterministic_algorithms_warn_only_enabled())
    torch.set_num_threads(spec.threads)
    # With more than one thread, a few kernels (as measured: the synthetic rows' steps) sum in an order that changes
    # from run to run; their deterministic variants make a build bitwise the same for a seed and a thread count.
    # Warn only: a kernel with no deterministic variant on another machine costs reproducibility, not the build.
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with retained_heap():  # each step frees and allocates the same large tensors: keep the pages (heap.py)
            return _train(model_dir, spec, tokenizer, episodes)
    finally:
        torch.set_num_threads(threads)  # process-wide settings: give the caller its own back
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def _train(model_dir: Path, spec: ToolTrainingSpec, tokenizer,
           maker: EpisodeMaker | EpisodeProcess | None) -> ToolTrainingReport:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(spec.seed)
    if maker is None:
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model_dir))
        maker = EpisodeMaker(tokenizer, spec)
    config = AutoConfig.from_pretrained(str(model_dir))
    pad_id = config.pad_token_id  # the tokenizer's (`tiny_model.write_random_weights`)
    config.rope_parameters = {"rope_type": "default", "rope_theta": ROPE_THETA}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), config=config, dtype=torch.float32)
    steps = maker.steps(spec.steps)
    used = sorted({i for step in steps for episode in step.all() for i in episode.ids} | maker.vocabulary())
    wire_copy_circuit(model, used, maker.digits, aliases=maker.aliases(), seed=spec.seed)
    model.train()
    inputs = TrainableRows(model.model.embed_tokens.weight, used)
    outputs = TrainableRows(model.lm_head.weight, used)
    params = [p for p in model.parameters() if p.requires_grad] + [inputs.delta, outputs.delta]
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: _lr_factor(i, spec))
    losses: list[float] = []
    bf16 = cpu_multiplies_bf16() if spec.bfloat16 is None else spec.bfloat16

    def train(step: Step) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, labels = _target_logits(model, inputs, outputs, step, pad_id=pad_id)
            loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())

    def measure(check: Step) -> float:
        return _margin(model, inputs, outputs, check, maker.digits, pad_id=pad_id)

    start = time.perf_counter()
    for step in steps:
        train(step)
    # The steps leave each agent's shell call a few logits from the next best name or argument (Claude Code's `Bash`
    # against its environment's "Shell: bash", Pi's `bash` against its "Bash command", Codex's `cmd` against
    # `command`), and which one falls short changed with the machine's bfloat16 numerics: checked and corrected here.
    # The same episodes every round: drawn afresh each round, an agent's margin swung by up to 2.6 logits between
    # rounds (Codex 2.70 -> 0.10 -> 2.43 while another agent was corrected), and a check of 8 rounds gave up on a
    # machine whose bf16 numerics left three agents short.
    checks = BuildChecks.draw(maker, spec)

    def correct(short: list[int]) -> None:
        for step in checks.corrections(maker, short):
            train(step)

    checked = corrected(len(checks.steps), lambda check: measure(checks.steps[check]), correct,
                        rounds=spec.check_rounds, margin=spec.check_margin)
    agent_margins, response_margin, first_turn_margin = checks.margins(checked)
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
        corrective_steps=len(losses) - len(steps),
        agent_margins={Path(path).stem: round(margin, 3) for path, margin in zip(spec.agent_requests, agent_margins)},
        response_margin=None if response_margin is None else round(response_margin, 3),
        first_turn_margin=None if first_turn_margin is None else round(first_turn_margin, 3),
        bfloat16=bf16,
    )
    record = {"spec": spec.to_json(), "report": report.__dict__}
    (model_dir / "interceptor_tool_training.json").write_text(json.dumps(record, indent=2) + "\n")
    return report


def _lr_factor(step: int, spec: ToolTrainingSpec) -> float:
    if step >= spec.steps:  # a corrective step
        return spec.check_learning_rate / spec.learning_rate
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _margin(model, inputs: TrainableRows, outputs: TrainableRows, step: Step, skip: list[int], *,
            pad_id: int) -> float:
    """The smallest lead of a target token's logit over the next best, across this step's targets other than
    `skip` (the digits: which number is copied is the task's skill, not the tool loop's): negative where greedy
    decoding would write another token. Run in float32, as the model is served. The tokens no episode uses count as
    one rival, their log-sum-exp (`_target_logits`): stricter than any one of them, whose logit is exactly 0."""
    import torch

    with torch.no_grad():
        logits, labels = _target_logits(model, inputs, outputs, step, pad_id=pad_id)
        keep = ~torch.isin(labels, outputs.slot[torch.tensor(skip)])
        logits, labels = logits[keep], labels[keep]
        target = logits.gather(1, labels[:, None])[:, 0]
        rival = logits.scatter(1, labels[:, None], -math.inf).max(dim=1).values
    return float((target - rival).min())


def _target_logits(model, inputs: TrainableRows, outputs: TrainableRows, step: Step, *, pad_id: int):
    """The logits at the positions that predict target tokens, over the full vocabulary, and the targets (as
    columns of those logits): what the step's cross-entropy is taken over.

    Only the trained output rows are multiplied out: every other row is zero (`trainer.models.copy_circuit`), so those
    tokens together contribute one logit of log(their count).
    """
    import torch

    chosen, labels = [], []
    for row in step.rows:  # one at a time: rows differ in length (a long prompt's), and padding costs as much
        input_ids, targets = _batch([row], start=0, pad_id=pad_id)
        chosen.append(hidden_states(model, inputs(input_ids), select=_predicting(targets)))
        labels.append(input_ids[:, 1:][targets[:, 1:]])
    if step.agents:
        # An agent's prompt is thousands of tokens: it is run once without gradient and the step's agent episodes
        # attend to its keys and values; so is text they share after their tasks (Claude Code's ~2k-token
        # environment; its first tokens stay each episode's own), run after the first episode's task. Each episode's
        # own task and turns keep their gradient: without it on the task, the model learnt to copy the tool name from
        # a shell-like word in the prompt (Pi's "Bash command to execute", Claude Code's "Shell: bash") instead of
        # from the offered tool's name.
        first = step.agents[0]
        context, (start, end) = first.context, first.shared_after
        interlude = None
        if end > start:
            prefix, interlude = prefix_and_interlude(model, inputs(torch.tensor([first.ids[:end]])), context=context,
                                                     start=start)
        else:
            prefix = prefix_states(model, inputs(torch.tensor([first.ids[:context]])))
        own = [dataclasses.replace(episode, ids=_own(episode.ids, episode), mask=_own(episode.mask, episode))
               for episode in step.agents]
        own_ids, targets = _batch(own, start=context, pad_id=pad_id)
        splits = [episode.shared_after[0] - context for episode in step.agents] if interlude else None
        chosen.append(hidden_states(model, inputs(own_ids), prefix=prefix, interlude=interlude, splits=splits,
                                    select=_predicting(targets)))
        labels.append(own_ids[:, 1:][targets[:, 1:]])
    logits = torch.cat(chosen) @ outputs(outputs.rows).T
    frozen = outputs.weight.shape[0] - len(outputs.rows)
    if frozen:
        logits = torch.cat([logits, logits.new_full((len(logits), 1), math.log(frozen))], dim=1)
    return logits, outputs.slot[torch.cat(labels)]


def _predicting(targets):
    """The positions whose states predict a target: position t predicts token t + 1."""
    import torch

    return torch.cat([targets[:, 1:], targets.new_zeros((len(targets), 1))], dim=1)


def _own(items: list, episode: Episode) -> list:
    """An episode's ids (or mask) without the span it shares with the step's other episodes after its task."""
    start, end = episode.shared_after
    return items[:start] + items[end:]


def _batch(episodes: list[Episode], *, start: int, pad_id: int):
    """Token ids from `start` on, padded at the right end (where causal attention keeps padding out of every real
    position), and the mask of target tokens."""
    import torch

    width = max(len(episode.ids) for episode in episodes) - start
    ids = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    targets = torch.zeros((len(episodes), width), dtype=torch.bool)
    for i, episode in enumerate(episodes):
        ids[i, : len(episode.ids) - start] = torch.tensor(episode.ids[start:])
        targets[i, : len(episode.ids) - start] = torch.tensor(episode.mask[start:])
    return ids, targets
