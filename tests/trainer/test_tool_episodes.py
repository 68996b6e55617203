"""The training episodes of the embedded default (`trainer.models.tool_episodes`): each agent's captured request is read
through the server's own dialect parser into the messages around its task, its tools and its shell tool's shape;
episodes behind one agent share the ids before their tasks (run once, without gradient), and Claude Code's
environment after them; the digits in an agent's prompt are drawn afresh each step, so no date or version is learned
as the answer; agent steps come evenly spaced, the agents in rounds; synthetic prompts name shells in prose."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from trainer.models.agent_contexts import SHELL_TOOLS, load_agent_request
from trainer.models.tool_episodes import _OWN_AFTER_TASK, EpisodeMaker, shell_tool
from trainer.models.tool_model import ToolTrainingSpec
from trainer.models.tool_texts import TOOL_OUTPUTS

REQUESTS = Path(__file__).resolve().parents[2] / "trainer" / "models" / "agent_requests"
SHAPES = {"pi": ("bash", "command"), "opencode": ("bash", "command"), "claude": ("Bash", "command"),
          "codex": ("exec_command", "cmd")}


@pytest.mark.parametrize("agent", sorted(SHAPES))
def test_an_agents_capture_reads_into_its_task_context_and_shell_shape(agent):
    context = load_agent_request(REQUESTS / f"{agent}_first_request.json")
    assert context.shell == SHAPES[agent]
    names = [tool["function"]["name"] for tool in context.tools]
    assert SHAPES[agent][0] in names and len(names) >= 4
    messages = context.messages({"role": "user", "content": "Submit the answer 7."})
    task = next(m for m in reversed(messages) if m["role"] == "user")
    assert task["content"].endswith("Submit the answer 7.")
    if agent == "claude":  # a reminder before the task in its message, its environment as a system message after
        assert task["content"].startswith("<system-reminder>") and [m["role"] for m in context.after] == ["system"]
    else:
        assert context.after == () and messages[-1] is task


def test_a_capture_without_a_known_shell_tool_is_refused(tmp_path):
    path = tmp_path / "request.json"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}], "tools": [' + str(
        shell_tool("run", "script")).replace("'", '"') + "]}")
    with pytest.raises(ValueError, match="no shell tool"):
        load_agent_request(path)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_episodes_behind_an_agent_share_everything_before_their_tasks_and_learn_only_the_replies(tokenizer):
    spec = ToolTrainingSpec(agent_requests=(REQUESTS / "claude_first_request.json",), agent_request_rate=1.0,
                            agent_episodes=3, tokens_per_step=64, row_tokens=64)
    step = EpisodeMaker(tokenizer, spec).step()
    first, *others = step.agents
    assert len(step.agents) == 3 and len({e.context for e in step.agents}) == 1
    shared = first.ids[:first.context]
    assert all(e.ids[:e.context] == shared for e in others)
    assert len({tuple(e.ids[:first.context + 1]) for e in step.agents}) > 1, "it ends where the tasks differ"
    assert not any(first.mask[:first.context]), "nothing in the shared context is a target"
    reminder = tokenizer.decode(shared)
    assert reminder.rstrip().endswith("</system-reminder>"), "the reminder before the task is part of the context"
    for episode in step.agents:
        targets = tokenizer.decode([i for i, m in zip(episode.ids, episode.mask) if m])
        assert re.fullmatch(r'<tool_call>\n\{"name": "Bash", "arguments": \{"command": "answer \d+"\}\}\n'
                            r"</tool_call><\|im_end\|>Done\.<\|im_end\|>", targets), targets


def test_episodes_behind_claude_code_share_its_environment_after_their_own_tasks(tokenizer):
    """Claude Code's ~2k-token environment after the task is marked to run once per step; each episode keeps its own
    task between the shared prompt and it, the environment's first tokens (where the first layer's heads read the
    task's last tokens), and the position that predicts its first target."""
    spec = ToolTrainingSpec(agent_requests=(REQUESTS / "claude_first_request.json",), agent_request_rate=1.0,
                            agent_episodes=4, tokens_per_step=64, row_tokens=64)
    agents = EpisodeMaker(tokenizer, spec).step().agents
    spans = [episode.ids[start:end] for episode in agents for start, end in [episode.shared_after]]
    assert all(span == spans[0] for span in spans) and len(spans[0]) > 1000
    assert "nvironment" in tokenizer.decode(spans[0])
    starts = [episode.shared_after[0] for episode in agents]
    heads = {tuple(episode.ids[start - _OWN_AFTER_TASK:start]) for episode, start in zip(agents, starts)}
    assert len(heads) == 1 and "<|im_start|>system" in tokenizer.decode(list(heads.pop())), "its own, alike in all"
    for episode in agents:
        start, end = episode.shared_after
        assert episode.context < start and end == episode.mask.index(True) - 1 and not any(episode.mask[start:end])
        assert re.search(r"\d", tokenizer.decode(episode.ids[episode.context:start])), "its own task, with its number"
    pi = dataclasses.replace(spec, agent_requests=(REQUESTS / "pi_first_request.json",))
    assert all(e.shared_after == (0, 0) for e in EpisodeMaker(tokenizer, pi).step().agents), "nothing long to share"


def test_agent_steps_are_evenly_spaced_and_take_the_agents_in_rounds_of_their_weights(tokenizer):
    requests = tuple(sorted(REQUESTS.glob("*_first_request.json")))  # claude, codex, opencode, pi
    spec = ToolTrainingSpec(agent_requests=requests, agent_weights=(2, 1, 1, 1), agent_request_rate=0.5,
                            agent_episodes=2, tokens_per_step=64, row_tokens=64)
    maker = EpisodeMaker(tokenizer, spec)
    steps = [maker.step() for _ in range(20)]
    assert [bool(step.agents) for step in steps] == [False, True] * 10
    shells = [tokenizer.decode(step.agents[0].ids) for step in steps if step.agents]
    names = [next(name for name in ("exec_command", "Bash", "bash") if f'"name": "{name}"' in text.split(
        "<tool_call>")[-1]) for text in shells]
    for round_ in (names[:5], names[5:]):
        assert sorted(round_) == ["Bash", "Bash", "bash", "bash", "exec_command"], round_


def test_a_step_behind_a_named_agent_and_exact_episodes_for_the_check(tokenizer):
    requests = tuple(sorted(REQUESTS.glob("*_first_request.json")))  # claude, codex, opencode, pi
    spec = ToolTrainingSpec(agent_requests=requests, agent_request_rate=0.0, agent_episodes=2, tokens_per_step=64,
                            row_tokens=64, wrong_answer_rate=1.0)
    maker = EpisodeMaker(tokenizer, spec)
    assert maker.agents == 4 and not maker.step().agents  # at rate 0 no step is an agent's unless asked
    step = maker.step(agent=1)
    assert len(step.agents) == 2 and '"name": "exec_command"' in tokenizer.decode(step.agents[0].ids)
    for exact in (False, True):
        for episode in maker.agent_episodes(0, 3, exact=exact):
            text = tokenizer.decode(episode.ids)
            asked = re.findall(r"[Tt]he answer (?:is )?(\d+)", text.rsplit("<tool_call>", 1)[0])[-1]
            called = re.search(r'"name": "Bash", "arguments": \{"command": "answer (\d+)"', text).group(1)
            assert (called == asked) == exact, (asked, called)  # wrong_answer_rate 1: every other target perturbed


def test_synthetic_prompts_name_shells_in_prose_other_than_the_offered_tool(tokenizer):
    """Agents write `Shell: bash` or `<shell>bash</shell>` near the task whatever tool they offer: the model must take
    the name from the tool, so synthetic prompts do the same."""
    maker = EpisodeMaker(tokenizer, ToolTrainingSpec(tokens_per_step=4096))
    text = "".join(tokenizer.decode(row.ids) for _ in range(3) for row in maker.step().rows)
    mention = re.compile(r"Shell: (\w+)|<shell>(\w+)</shell>|Use (\w+) for file|non-trivial (\w+) command")
    pairs = set()
    for episode in text.split("Done.<|im_end|>"):
        called = re.search(r'<tool_call>\n\{"name": "(\w+)"', episode)
        for found in mention.finditer(episode):
            if called:
                pairs.add((next(g for g in found.groups() if g), called.group(1)))
    assert any(said != called for said, called in pairs) and any(said == called for said, called in pairs), pairs


def test_the_digits_and_the_rollout_directory_of_an_agents_prompt_change_from_step_to_step(tokenizer):
    spec = ToolTrainingSpec(agent_requests=(REQUESTS / "codex_first_request.json",), agent_request_rate=1.0,
                            agent_episodes=2, tokens_per_step=64, row_tokens=64)
    maker = EpisodeMaker(tokenizer, spec)
    texts = [tokenizer.decode(maker.step().agents[0].ids) for _ in range(3)]
    dates = [re.findall(r"<current_date>(\d+-\d+-\d+)</current_date>", text) for text in texts]
    assert all(len(found) == 1 for found in dates) and len({found[0] for found in dates}) == 3
    assert "2026-11-22" not in {found[0] for found in dates}  # the capture's own date
    workspaces = [set(re.findall(r"<cwd>(.*)</cwd>", text)) for text in texts]
    assert all(len(found) == 1 for found in workspaces) and len(set.union(*workspaces)) == 3
    assert all(re.fullmatch(r"/tmp/(interceptor-sandboxes/)?interceptor-rollout-\w{8}/workspace", w)
               for found in workspaces for w in found)


def test_synthetic_episodes_offer_each_shell_shape(tokenizer):
    maker = EpisodeMaker(tokenizer, ToolTrainingSpec(tokens_per_step=4096))
    text = "".join(tokenizer.decode(row.ids) for _ in range(3) for row in maker.step().rows)
    for name, argument in SHELL_TOOLS:
        assert f'{{"name": "{name}", "arguments": {{"{argument}": "answer ' in text


def test_the_checks_answer_after_each_tool_response_comes_from_its_own_draws(tokenizer):
    """The build checks "Done." after every tool response training uses, in the plainest request (the bash tool and
    "Submit the answer N."); drawing those checks leaves every training episode as it was (a build whose check
    passes is the same build), and a corrective step's episodes end in the responses asked for."""
    spec = ToolTrainingSpec(tokens_per_step=256, row_tokens=128, wrong_answer_rate=1.0)
    plain, checked = EpisodeMaker(tokenizer, spec), EpisodeMaker(tokenizer, spec)
    groups = checked.response_checks(2, seed=1)
    assert [plain.step() for _ in range(3)] == [checked.step() for _ in range(3)]
    assert len(groups) == len(TOOL_OUTPUTS) and all(len(group) == 2 for group in groups)
    for response, group in zip(TOOL_OUTPUTS, groups):
        for episode in group:
            text = tokenizer.decode(episode.ids)
            number = re.search(r"Submit the answer (\d+)\.<\|im_end\|>", text).group(1)  # exact: the task's own
            assert f'"name": "bash", "arguments": {{"command": "answer {number}"}}' in text
            assert f"<tool_response>\n{response.format(n=number)}\n</tool_response>" in text
            assert tokenizer.decode([i for i, m in zip(episode.ids, episode.mask) if m]) == "Done.<|im_end|>"
    step = checked.response_step(("", "wrong"))
    assert step.rows and not step.agents
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", tokenizer.decode(
        [i for row in step.rows for i in row.ids]), re.S)
    assert responses and set(responses) <= {"", "wrong"}


def test_the_checks_first_calls_come_from_their_own_draws_and_mark_only_whether_it_calls(tokenizer):
    """The build checks whether the first turn calls a tool at all, in synthetic requests like training's (a shell
    tool alone or among others, behind the usual system prompts): its own draws (training's episodes stay as they
    were), every one with a tool, the task's own number, and only the call's first token marked."""
    spec = ToolTrainingSpec(tokens_per_step=256, row_tokens=128, wrong_answer_rate=1.0, no_tools_rate=0.5)
    plain, checked = EpisodeMaker(tokenizer, spec), EpisodeMaker(tokenizer, spec)
    episodes = checked.first_turn_checks(6, seed=2)
    assert [plain.step() for _ in range(3)] == [checked.step() for _ in range(3)]
    assert len(episodes) == 6 and episodes == EpisodeMaker(tokenizer, spec).first_turn_checks(6, seed=2)
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    for episode in episodes:
        assert [i for i, m in zip(episode.ids, episode.mask) if m] == [call]
        first = episode.mask.index(True)
        task = tokenizer.decode(episode.ids[:first])
        assert '"type": "function"' in task  # tools offered
        called = re.search(r'"arguments": \{"\w+": "answer (\d+)"', tokenizer.decode(episode.ids[first:])).group(1)
        assert re.search(rf"(?<!\d){called}(?!\d)", task.split("<|im_start|>user")[-1])  # exact: the task's own
    step = checked.first_turn_step()
    assert step.rows and not step.agents and step.episodes >= len(step.rows)
