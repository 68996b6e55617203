"""`train_tool_calling`: the embedded default (a tiny model trained offline in a minute or two) calls whichever shell
tool the request offers (`bash(command)`, `Bash(command)`, `exec_command(cmd)`) with `answer N` for numbers and
phrasings it never saw, inside the four agents' real prompts too, says "Done." after the tool response, keeps some
sampling variance, and trains the same way twice for a seed. Generation is plain transformers `generate` on the
model's own chat template; calls are parsed with the interceptor's own parser."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from interceptor.wire.parsing import parse_output
from trainer.models.agent_contexts import SHELL_TOOLS, load_agent_request
from trainer.models.local_model import LOCAL_TRAINING
from trainer.models.tiny_model import TinyModelSpec, make_tiny_model
from trainer.models.tool_check import BuildChecks
from trainer.models.tool_episodes import EpisodeMaker, shell_tool
from trainer.models.tool_steps import Step
from trainer.rl.precision import cpu_multiplies_bf16
from trainer.models.tool_model import (
    BASH_TOOL, DONE_TEXT, ToolTrainingReport, ToolTrainingSpec, _target_logits, tool_model_spec, train_tool_calling,
)
from trainer.models.trainable_rows import TrainableRows

# The agents' captured first requests, shipped with the trainer (the same captures as in tests/data).
REQUESTS = Path(__file__).resolve().parents[2] / "trainer" / "models" / "agent_requests"
AGENT_REQUESTS = {name: REQUESTS / f"{name}_first_request.json" for name in ("pi", "opencode", "claude", "codex")}
# Phrasings and numbers the training episodes never use (training draws from a fixed list of phrasings).
HELD_OUT_TASKS = (
    "Please submit the answer {n} when ready.",
    "Submit the answer {n}, nothing else.",
    "I computed it already: submit the answer {n} via bash.",
    "There are 17 files here. Submit the answer {n}.",
)
READ_TOOL = {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
END = "<|im_end|>"


@pytest.fixture(scope="module")
def trained(tool_model_dir):
    """The embedded default (tests/conftest.py builds it once per session, with the agents' captured prompts)."""
    record = json.loads((tool_model_dir / "interceptor_tool_training.json").read_text())
    assert record["spec"]["agent_requests"] == sorted(AGENT_REQUESTS[a].name for a in AGENT_REQUESTS)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32).eval()
    return ToolTrainingReport(**record["report"]), tokenizer, model


def _numbers(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    digits = [rng.choice((1, 2, 3, 4)) for _ in range(count)]
    return [rng.randrange(10 ** (d - 1) if d > 1 else 0, 10**d) for d in digits]


def _prompt(tokenizer, messages: list[dict], tools: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def _generate(trained, prompts: list[str], *, sample: bool = False, max_new_tokens: int = 40) -> list[str]:
    _, tokenizer, model = trained
    texts = []
    for i in range(0, len(prompts), 8):
        batch = tokenizer(prompts[i:i + 8], return_tensors="pt", padding=True, add_special_tokens=False)
        options = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **options)
        texts += [tokenizer.decode(row, skip_special_tokens=False).replace(tokenizer.pad_token, "")
                  for row in out[:, batch["input_ids"].shape[1]:]]
    return texts


def _generate_after_common_prefix(trained, prompts: list[str], *, max_new_tokens: int = 40) -> list[str]:
    """Greedy, as `_generate`, for prompts that share an agent's 6k-14k-token prompt: its keys and values are
    computed once and each prompt goes on from a copy of them (padded batches of such prompts took minutes)."""
    _, tokenizer, model = trained
    rows = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in prompts]
    common = min(len(os.path.commonprefix(rows)), min(map(len, rows)) - 1)
    texts = []
    with torch.no_grad():
        shared = model(torch.tensor([rows[0][:common]]), use_cache=True).past_key_values
        for row in rows:
            out = model.generate(torch.tensor([row]), attention_mask=torch.ones(1, len(row), dtype=torch.long),
                                 cache=copy.deepcopy(shared), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
            texts.append(tokenizer.decode(out[0, len(row):], skip_special_tokens=False)
                         .replace(tokenizer.pad_token, ""))
    return texts


def _submits(text: str, number: int, shell: tuple[str, str] = ("bash", "command")) -> bool:
    """Exactly one call of the shell tool with `answer <number>`, nothing else, then the end of the turn."""
    if not text.endswith(END) or text.count(END) != 1:
        return False
    parsed = parse_output(text.removesuffix(END))
    name, argument = shell
    return (parsed.content is None and not parsed.malformed and len(parsed.calls) == 1
            and parsed.calls[0].name == name
            and json.loads(parsed.calls[0].arguments) == {argument: f"answer {number}"})


def _first_turns(tokenizer, numbers: list[int], *, system: str | None, tools: list[dict]) -> list[str]:
    head = [{"role": "system", "content": system}] if system else []
    tasks = [HELD_OUT_TASKS[i % len(HELD_OUT_TASKS)].format(n=n) for i, n in enumerate(numbers)]
    return [_prompt(tokenizer, head + [{"role": "user", "content": task}], tools) for task in tasks]


def test_training_fits_the_episodes(trained):
    # How long it takes is measured in bench/bench_tool_model.py, not asserted here.
    report, _, _ = trained
    assert report.final_loss < 0.5 < report.first_loss


def test_the_build_checked_every_agents_prompt_and_left_each_call_a_margin_ahead(trained):
    # After its steps the build checks, in float32 as served, that every target token of the call and of "Done."
    # (the digits aside) leads the next best by `check_margin` behind each agent's prompt, and trains on the prompts
    # that fall short (trainer.models.tool_model): which agent fell short varied with the machine's bfloat16 numerics.
    report, _, _ = trained
    assert set(report.agent_margins) == {path.stem for path in AGENT_REQUESTS.values()}
    assert min(report.agent_margins.values()) >= LOCAL_TRAINING.check_margin, report
    # and "Done." after every tool response in the plainest request (an fp32 build called the tool again after an
    # empty response to "Submit the answer 7." until the check covered it)
    assert report.response_margin is not None and report.response_margin >= LOCAL_TRAINING.check_margin, report
    # and that the first turn calls a tool at all in synthetic requests like training's (a build whose every agent
    # passed said "Done." at once for 6 of 24 held-out numbers behind a read tool and the bash tool)
    assert report.first_turn_margin is not None and report.first_turn_margin >= LOCAL_TRAINING.check_margin, report


def test_the_build_multiplies_in_bf16_only_where_the_cpu_has_bf16_units(trained):
    # Emulated, bf16 products made a build 8.5x slower than fp32 on a CPU without them (trainer.rl.precision).
    report, _, _ = trained
    assert LOCAL_TRAINING.bfloat16 is None  # the default: chosen by the CPU
    assert report.bfloat16 == cpu_multiplies_bf16()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # the kernel's own word on the CPU's features
        flags = set(re.findall(r"^flags\s*:\s*(.*)$", cpuinfo.read_text(), re.M)[0].split())
        assert cpu_multiplies_bf16() == bool(flags & {"amx_tile", "avx512_bf16"})


def test_greedy_decoding_calls_bash_with_held_out_numbers(trained):
    numbers = _numbers(24, seed=101)
    texts = _generate(trained, _first_turns(trained[1], numbers, system="You are a coding agent.",
                                            tools=[READ_TOOL, BASH_TOOL]))
    right = sum(map(_submits, texts, numbers))
    assert right >= 0.8 * len(numbers), texts


def test_after_the_tool_response_the_model_says_done_without_a_call(trained):
    tokenizer = trained[1]
    prompts = []
    for n, output in zip(_numbers(8, seed=102), ("ok", "", "Answer recorded.", "error: no such command") * 2):
        call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps(
            {"command": f"answer {n}"})}}
        prompts.append(_prompt(tokenizer, [
            {"role": "user", "content": f"Submit the answer {n}."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": output},
        ], [BASH_TOOL]))
    texts = _generate(trained, prompts, max_new_tokens=12)
    parsed = [parse_output(text.removesuffix(END)) for text in texts]
    assert all(text.endswith(END) and not p.calls and p.content for text, p in zip(texts, parsed)), texts
    assert sum(p.content == DONE_TEXT for p in parsed) >= 7, texts


def test_sampling_at_temperature_one_is_mostly_right_but_not_always(trained):
    torch.manual_seed(0)
    numbers = _numbers(12, seed=103) * 3
    texts = _generate(trained, _first_turns(trained[1], numbers, system=None, tools=[BASH_TOOL]), sample=True)
    right = sum(map(_submits, texts, numbers))
    assert 0.5 * len(numbers) <= right < len(numbers), texts


@pytest.mark.parametrize("shell", SHELL_TOOLS, ids=lambda shape: shape[0])
def test_greedy_decoding_calls_whichever_shell_tool_the_request_offers(trained, shell):
    numbers = _numbers(12, seed=105)
    texts = _generate(trained, _first_turns(trained[1], numbers, system="You are a coding agent.",
                                            tools=[READ_TOOL, shell_tool(*shell)]))
    assert sum(_submits(text, n, shell) for text, n in zip(texts, numbers)) >= 0.8 * len(numbers), texts


def _calls_the_shell(text: str, shell: tuple[str, str]) -> bool:
    """Exactly one call of the shell tool with its one argument, `answer <digits>`, then the end of the turn."""
    if not text.endswith(END) or text.count(END) != 1:
        return False
    parsed = parse_output(text.removesuffix(END))
    if parsed.content is not None or parsed.malformed or len(parsed.calls) != 1 or parsed.calls[0].name != shell[0]:
        return False
    arguments = json.loads(parsed.calls[0].arguments)
    return list(arguments) == [shell[1]] and re.fullmatch(r"answer \d+", arguments[shell[1]]) is not None


# Claude Code puts ~2k tokens with numbers (its environment, the date) between the task and the answer: there the
# two-token copy circuit took a wrong continuation of a one-digit number now and then (`answer 2026` for 2: 15 of 16
# right on the default build, 7 to 12 of 16 on others), so only its call was asserted; with the third token back in
# the match (trainer.models.copy_circuit), seeds 0-3 wrote 16, 15, 16 and 15 of 16 exactly, like the other agents.


@pytest.mark.parametrize("agent", sorted(AGENT_REQUESTS))
def test_the_model_calls_the_shell_tool_inside_the_agents_real_prompt(trained, agent):
    """Inside each agent's captured request, with the messages around its task as the agent sends them (Claude
    Code: a reminder before the task, a system message after it; Codex: an environment-context message before),
    with phrasings and numbers training never used: the agent's own shell tool, called with `answer N`."""
    path = AGENT_REQUESTS[agent]
    assert path.is_file(), f"no captured first request of {agent} in {REQUESTS}"
    context = load_agent_request(path)  # Messages and Responses captures read as the server reads them
    numbers = _numbers(16, seed=104)
    tasks = [HELD_OUT_TASKS[i % len(HELD_OUT_TASKS)].format(n=n) for i, n in enumerate(numbers)]
    prompts = [_prompt(trained[1], context.messages({"role": "user", "content": task}), list(context.tools))
               for task in tasks]
    texts = _generate_after_common_prefix(trained, prompts)
    assert sum(_calls_the_shell(text, context.shell) for text in texts) >= 14, texts
    assert sum(_submits(text, n, context.shell) for text, n in zip(texts, numbers)) >= 14, texts


def _step_and_alone(model, step: Step):
    """The step's targets' log-probabilities and margins over the next best token as the build computes them
    (`_target_logits`), and as the served model computes them from each episode alone."""
    used = torch.nonzero(model.lm_head.weight.abs().sum(1)).flatten().tolist()  # the rows training used
    inputs, outputs = TrainableRows(model.model.embed_tokens.weight, used), TrainableRows(model.lm_head.weight, used)
    frozen = model.lm_head.weight.shape[0] - len(used)

    def scored(logits, labels):
        target = logits.gather(1, labels[:, None])[:, 0]
        rival = logits.scatter(1, labels[:, None], -math.inf).max(dim=1).values
        return logits.log_softmax(dim=1).gather(1, labels[:, None])[:, 0], target - rival

    with torch.no_grad():
        ours, labels = _target_logits(model, inputs, outputs, step, pad_id=model.config.pad_token_id)
        alone = []
        for episode in step.agents:  # the served model's logits at the targets, over the used rows only (the lm_head
            # of ~14k positions over the whole vocabulary is gigabytes, and every other row is zero)
            hidden = model.model(torch.tensor([episode.ids])).last_hidden_state[0, :-1]
            logits = hidden[torch.tensor(episode.mask[1:])] @ model.lm_head.weight[used].T
            alone.append(torch.cat([logits, logits.new_full((len(logits), 1), math.log(frozen))], dim=1))
    return scored(ours, labels), scored(torch.cat(alone), labels)


def _claude_spec():
    return dataclasses.replace(LOCAL_TRAINING, agent_requests=(AGENT_REQUESTS["claude"],), agent_weights=(), seed=7,
                               check_episodes=4)


def test_the_builds_check_measures_behind_claude_codes_prompt_what_the_model_computes_for_each_episode_alone(trained):
    """The check decides whether the build is done: its margins behind Claude Code's prompt, with the ~2k-token
    environment after each task, are the served model's own for each episode (`tool_check.BuildChecks`)."""
    _, tokenizer, model = trained
    spec = _claude_spec()
    for seed in range(2):
        checks = BuildChecks.draw(EpisodeMaker(tokenizer, dataclasses.replace(spec, seed=seed)), spec)
        step = checks.steps[0]
        assert len(step.agents) == 4 and all(len(e.ids) - e.context > 1000 for e in step.agents), "the environment"
        (ours_logp, ours_margin), (logp, margin) = _step_and_alone(model, step)
        torch.testing.assert_close(ours_logp, logp, atol=1e-4, rtol=0)
        torch.testing.assert_close(ours_margin, margin, atol=1e-4, rtol=0)


def test_a_step_behind_claude_codes_prompt_runs_the_environment_once_and_learns_what_the_model_computes(trained):
    """A training step runs Claude Code's prompt and the ~2k-token environment after the tasks once for all its
    episodes (trainer.models.tool_episodes, trainer.models.tool_forward): the environment's states are the first episode's, and
    each other episode's targets read them as its own. What the step learns from, its targets' log-probabilities,
    must stay what the served model computes from each episode alone. (When the environment's first tokens were
    shared too, an episode other than the first read the first one's task there: its log-probabilities were up to
    0.31 off at a number's end on the AVX2 fp32 build, 0.65 on the AVX512-BF16 one.) The approximation's error
    depends on the weights: within 0.087 on the AVX2 fp32 build; on the AVX512-BF16 build 0.30 at one number's end in
    one draw, 0.001-0.006 on average per target, and margins up to 3.8 off; so the check measures each episode
    whole (the test above)."""
    _, tokenizer, model = trained
    maker = EpisodeMaker(tokenizer, _claude_spec())
    for _ in range(3):
        episodes = maker.agent_episodes(0, 4, exact=True)
        assert all(e.shared_after[1] - e.shared_after[0] > 1000 for e in episodes), "the environment runs once"
        (ours_logp, _), (logp, _) = _step_and_alone(model, Step(rows=[], agents=episodes, episodes=4))
        error = (ours_logp - logp).abs()
        assert float(error.mean()) <= 0.02 and float(error.max()) <= 0.5, error


def test_training_is_deterministic_for_a_seed(tmp_path):
    # With the default two threads: deterministic kernels keep a build bitwise the same (without them, two threads
    # summed in an order that changed from run to run).
    from safetensors.torch import load_file

    base = make_tiny_model(tmp_path / "base", tool_model_spec(real_vocab=False))
    weights = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        copy = tmp_path / name
        copy.mkdir()
        for file in base.iterdir():
            (copy / file.name).write_bytes(file.read_bytes())
        train_tool_calling(copy, ToolTrainingSpec(steps=3, tokens_per_step=512, seed=seed))
        weights[name] = load_file(copy / "model.safetensors")
    assert all(torch.equal(weights["a"][k], weights["b"][k]) for k in weights["a"])
    assert not all(torch.equal(weights["a"][k], weights["c"][k]) for k in weights["a"])


def test_a_model_of_another_shape_is_refused_before_training(tmp_path):
    model_dir = make_tiny_model(tmp_path / "default", TinyModelSpec())
    with pytest.raises(ValueError, match="tool_model_spec"):
        train_tool_calling(model_dir, ToolTrainingSpec(steps=1))


@pytest.mark.parametrize("field", [{"check_rounds": -1}, {"check_episodes": 0}, {"check_margin": -0.5},
                                   {"check_learning_rate": 0.0}, {"check_first_turns": -1}])
def test_spec_rejects_a_check_that_cannot_run(field):
    with pytest.raises(ValueError, match="check_"):
        ToolTrainingSpec(**field)


def test_spec_rejects_rates_outside_zero_to_one():
    with pytest.raises(ValueError):
        ToolTrainingSpec(wrong_answer_rate=1.5)
