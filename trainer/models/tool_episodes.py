"""The episodes the tool-calling model is trained on (`trainer.models.tool_model`): synthetic tasks and agents' real
prompts, rendered with the model's own chat template into token ids and a mask of the tokens to learn.

An episode is a task that asks for a number, the assistant's shell call `answer N`, the tool's response and
`Done.`; a request without tools (OpenCode's title request) gets a short text. The shell tool has the shape of one
of the agents': `bash(command)` (Pi, OpenCode), `Bash(command)` (Claude Code) or `exec_command(cmd)` (Codex), and
the model learns to call whichever the request offers. Steps pack episodes into rows, and now and then add
episodes behind one agent's captured first request: the messages around its task and its tools (a Messages or
Responses capture is read through the server's own dialect parser).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import re
from typing import TYPE_CHECKING

from interceptor.tokens.chunk_ids import ChunkIds, cut_after

from trainer.models.agent_contexts import SHELL_TOOLS, Context, load_agent_request
from trainer.models.tool_steps import Episode, Step, first_target, last_target
from trainer.models.tool_texts import (
    AFTER_SYSTEMS, DISTRACTIONS, FILLER_WORDS, OTHER_TOOLS, SHELL_MENTION_RATE, SHELL_MENTIONS, SHELL_WORDS,
    SHORT_SYSTEMS, TASK_PREFIXES, TASKS, TOOL_OUTPUTS,
)

if TYPE_CHECKING:
    from trainer.models.tool_model import ToolTrainingSpec

__all__ = ["BASH_TOOL", "DONE_TEXT", "TITLE_TEXT", "EpisodeMaker", "answer_call", "shell_tool"]

DONE_TEXT = "Done."
TITLE_TEXT = "Submit the answer"  # what a request without tools (OpenCode's title request) gets
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command to run."}},
            "required": ["command"],
        },
    },
}


def shell_tool(name: str, argument: str) -> dict:
    """A shell function tool of this shape (one of `agent_contexts.SHELL_TOOLS`; BASH_TOOL is `bash(command)`)."""
    tool = json.loads(json.dumps(BASH_TOOL))
    function = tool["function"]
    function["name"] = name
    function["parameters"]["properties"] = {argument: function["parameters"]["properties"]["command"]}
    function["parameters"]["required"] = [argument]
    return tool


def answer_call(number: int | str, *, tool: str = "bash", argument: str = "command") -> str:
    """The text of the tool call the trained model is taught to emit (without the end-of-turn token)."""
    call = {"name": tool, "arguments": {argument: f"answer {number}"}}
    return "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"


_PLAIN = Context(before=(), tools=(BASH_TOOL,), shell=("bash", "command"))  # with "Submit the answer N."
_DIGITS = re.compile(r"\d+")
_CAPTURED_ROLLOUT_DIR = "/tmp/interceptor-rollout"  # how the captures in trainer/agent_requests write it
# Shared text after the tasks this long or longer runs once per step (Claude Code's environment, ~2k tokens) instead
# of once per episode, each episode's own task keeping its gradient. Shorter (the other agents: the end-of-turn and
# the assistant header) runs with each episode, exactly.
_SHARED_AFTER_TOKENS = 64
# The first tokens of that shared text stay each episode's own: the shared text's states are computed once, after the
# first episode's task, and the first layer's heads that read the last tokens before a position (the copy circuit's)
# would give its first positions that episode's task's last tokens. A task that ends in its number ("... the answer
# 4.") lost the end of the number to the copy head that way: over three draws of four episodes the step's margins were
# up to 4.1 logits from the model's own (the build's check corrected such margins, in the wrong direction).
_OWN_AFTER_TASK = 8
_REMEMBERED_TURN_CHARS = 2048  # turns this long recur (Claude Code's environment after the task): encoded once


def _function_tool(name: str, description: str, parameters: tuple[str, ...]) -> dict:
    properties = {p: {"type": "string"} for p in parameters}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(parameters)}}}


def _share_context(episodes: list[Episode]) -> list[Episode]:
    """Episodes behind one agent's prompt, their context extended to all the ids they share: the prompt and
    whatever the agent puts before the task in its message (Claude Code's ~2k-token reminder), which then runs once,
    without gradient, instead of once per episode. Ids they share after their tasks, if there are at least
    `_SHARED_AFTER_TOKENS` (Claude Code's environment), are marked `shared_after`: run once too, but for the first
    `_OWN_AFTER_TASK` of them, which each episode runs as its own."""
    if len({tuple(episode.ids[:episode.context]) for episode in episodes}) != 1:
        raise ValueError("an agent's prompt did not encode to the same context ids twice")
    if len(episodes) < 2:
        return episodes
    shared = len(os.path.commonprefix([episode.ids for episode in episodes]))
    ends = [episode.mask.index(True) - 1 for episode in episodes]  # the position that predicts the first target
    shared = min(shared, min(ends))  # keep that position with its episode
    suffix = len(os.path.commonprefix([episode.ids[shared:end][::-1] for episode, end in zip(episodes, ends)]))
    suffix = min(suffix, min(ends) - shared - 1)  # each episode keeps at least one token of its own task
    suffix -= _OWN_AFTER_TASK  # and the first tokens after it (above)
    return [dataclasses.replace(episode, context=max(episode.context, shared),
                                shared_after=(end - suffix, end) if suffix >= _SHARED_AFTER_TOKENS else (0, 0))
            for episode, end in zip(episodes, ends)]


class EpisodeMaker:
    """Draws two-turn episodes and encodes them as (token ids, target mask) with the model's chat template."""

    def __init__(self, tokenizer, spec: ToolTrainingSpec) -> None:
        self._tokenizer = tokenizer
        self._spec = spec
        self._rng = random.Random(spec.seed)
        self._agents = [load_agent_request(p) for p in spec.agent_requests]
        self._end = tokenizer.eos_token  # <|im_end|>
        self._pending: list[Episode] = []
        # An agent step's episodes share their prompt (thousands of tokens): the last one encoded is kept.
        self._encode_context = functools.lru_cache(maxsize=1)(
            lambda text: self._tokenizer.encode(text, add_special_tokens=False))
        # So do long turns after the task (Claude Code's ~2k-token environment): kept as the gate keeps an agent's
        # system prompt, by `ChunkIds` over the text cut after each end-of-turn token.
        self._turn_ids = ChunkIds(min_chars=_REMEMBERED_TURN_CHARS)
        self._agent_credit = 0.0  # agent steps come at `agent_request_rate`, evenly spaced
        self._deck: list[int] = []  # the agents (indices) still to come in this round
        self.digits = [tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
        # Words that may follow the number: any vocabulary entry without digits, so that the model learns to stop
        # at "not a digit" rather than at a few words it has seen.
        self._words = [w for w in (tokenizer.decode([i]) for i in range(min(len(tokenizer), 60000), 0, -97))
                       if w.strip() and not any(c.isdigit() or c in "<>{}" for c in w)]

    def vocabulary(self) -> set[int]:
        """Tokens the model should be able to write even if this run's episodes happen not to use them."""
        calls = [answer_call(0, tool=name, argument=argument) for name, argument in SHELL_TOOLS]
        text = " ".join([*"0123456789", DONE_TEXT, TITLE_TEXT, *calls, self._end])
        return set(self._tokenizer.encode(text, add_special_tokens=False))

    def aliases(self) -> list[tuple[int, int]]:
        """(token, alias) pairs the copy circuit should start out treating as one token: the word before the number
        as the call writes it (`answer`) and as a task does (` answer`)."""
        pairs = [(self._tokenizer.encode(word, add_special_tokens=False),
                  self._tokenizer.encode(" " + word, add_special_tokens=False)) for word in ("answer",)]
        return [(token[0], alias[0]) for token, alias in pairs if len(token) == len(alias) == 1]

    @property
    def agents(self) -> int:
        """How many agents' captured requests the episodes are drawn behind."""
        return len(self._agents)

    def step(self, agent: int | None = None) -> Step:
        """Episodes for one step: rows of about `row_tokens` packed back to back (earlier episodes are just more
        context for later ones, like a long system prompt), about `tokens_per_step` in all; and, at
        `agent_request_rate`, a few episodes behind one agent's real prompt. Agent steps are evenly spaced and take
        the agents in rounds (each `agent_weights` times per round, shuffled): a random draw leaves one agent unseen
        for long stretches, and the model then forgets which of the shell names its prompt offers. With `agent`
        (an index into `agent_requests`), the step's agent episodes are behind that agent's prompt."""
        spec = self._spec
        rows, count = self._rows(TOOL_OUTPUTS)
        agents: list[Episode] = []
        if agent is not None:
            agents = self.agent_episodes(agent, spec.agent_episodes)
        else:
            self._agent_credit += spec.agent_request_rate
            if self._agents and self._agent_credit >= 1.0:
                self._agent_credit -= 1.0
                if not self._deck:
                    weights = spec.agent_weights or (1,) * len(self._agents)
                    self._deck = [i for i, weight in enumerate(weights) for _ in range(weight)]
                    self._rng.shuffle(self._deck)
                agents = self.agent_episodes(self._deck.pop(), spec.agent_episodes)
        return Step(rows=rows, agents=agents, episodes=count + len(agents))

    def steps(self, count: int) -> list[Step]:
        """The next `count` steps (`step()` each)."""
        return [self.step() for _ in range(count)]

    def response_step(self, responses: tuple[str, ...]) -> Step:
        """A step of episodes in the plainest request, every tool response one of `responses` (the build's
        corrective step for the answers after them that its check found short)."""
        rows, count = self._rows(responses, plain=True)
        return Step(rows=rows, agents=[], episodes=count)

    def response_checks(self, count: int, *, seed: int) -> list[list[Episode]]:
        """The answer after each tool response training uses (`tool_texts.TOOL_OUTPUTS`), in the plainest request:
        the bash tool and "Submit the answer N." `count` exact episodes per response (other numbers), drawn from
        their own seed (every other draw stays as it was), only the answer after the response ("Done.") marked."""
        kept, self._rng = self._rng, random.Random(seed)
        try:
            episodes = [[self._episode(_PLAIN, exact=True, responses=(response,), plain=True) for _ in range(count)]
                        for response in TOOL_OUTPUTS]
        finally:
            self._rng = kept
        return [[dataclasses.replace(e, mask=last_target(e.mask)) for e in group] for group in episodes]

    def first_turn_step(self) -> Step:
        """A step of synthetic rows alone (no agent's prompt): the build's corrective step for first calls that its
        check found short (`first_turn_checks`)."""
        rows, count = self._rows(TOOL_OUTPUTS)
        return Step(rows=rows, agents=[], episodes=count)

    def first_turn_checks(self, count: int, *, seed: int) -> list[Episode]:
        """`count` exact synthetic episodes with a shell tool (alone or among others, behind the usual system
        prompts), drawn from their own seed, only the first call's first token marked: whether greedy decoding calls
        a tool at the first turn of a request like the ones training draws, where the agents' checks do not look."""
        kept, self._rng = self._rng, random.Random(seed)
        try:
            episodes = []
            while len(episodes) < count:
                context = self._context()
                if context.tools:
                    episodes.append(self._episode(context, exact=True))
        finally:
            self._rng = kept
        return [dataclasses.replace(e, mask=first_target(e.mask)) for e in episodes]

    def _rows(self, responses: tuple[str, ...], *, plain: bool = False) -> tuple[list[Episode], int]:
        """Rows of about `row_tokens` (episodes packed back to back), about `tokens_per_step` in all, and how many
        episodes they hold: synthetic episodes (one that did not fit the last row starts the next step's), or
        `plain` ones (the plainest request: `response_checks`)."""
        pending = not plain
        rows: list[Episode] = []
        count = 0
        while sum(len(row.ids) for row in rows) < self._spec.tokens_per_step:
            ids: list[int] = []
            mask: list[bool] = []
            while len(ids) < self._spec.row_tokens:
                if pending and self._pending:
                    episode = self._pending.pop()
                else:
                    episode = self._episode(_PLAIN if plain else self._context(), responses=responses, plain=plain)
                if ids and len(ids) + len(episode.ids) > self._spec.row_tokens:
                    if pending:
                        self._pending.append(episode)
                    break
                ids += episode.ids
                mask += episode.mask
                count += 1
            rows.append(Episode(ids=ids, mask=mask))
        return rows, count

    def agent_episodes(self, agent: int, count: int, *, exact: bool = False) -> list[Episode]:
        """`count` episodes behind one agent's prompt, sharing its context (`_share_context`); `exact`: every
        target submits the task's own number (no `wrong_answer_rate`), for checking what greedy decoding writes."""
        context = self._agents[agent]
        # Dates, paths, versions and counts in an agent's prompt change from run to run, before the task and
        # after it (a number after the task is the nearest to copy by mistake), and so does the rollout's
        # directory (Codex and Claude Code name it in their prompts).
        before, after = ([{**m, "content": self._vary(m["content"])} if isinstance(m.get("content"), str) else m
                          for m in messages] for messages in (context.before, context.after))
        context = dataclasses.replace(context, before=tuple(before), after=tuple(after),
                                      task_prefix=self._vary(context.task_prefix))
        return _share_context([self._episode(context, exact=exact) for _ in range(count)])

    def _episode(self, context: Context, *, exact: bool = False, responses: tuple[str, ...] = TOOL_OUTPUTS,
                 plain: bool = False) -> Episode:
        rng = self._rng
        tools, (shell, argument) = list(context.tools), context.shell
        n = self._number()
        head = context.messages({"role": "user", "content": TASKS[0].format(n=n)} if plain else self._task(n))
        if not tools:
            return self._encode([(self._render(head, None), False), (TITLE_TEXT + self._end, True)])
        submitted = self._perturb(n) if rng.random() < self._spec.wrong_answer_rate and not exact else n
        call = {"id": "call_0", "type": "function",
                "function": {"name": shell, "arguments": json.dumps({argument: f"answer {submitted}"})}}
        first = self._render(head, tools)
        turn = answer_call(submitted, tool=shell, argument=argument) + self._end
        full = self._render(head + [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": rng.choice(responses).format(n=submitted)},
        ], tools)
        if not full.startswith(first + turn):
            raise ValueError("the chat template does not render the assistant's tool call as the model emits it")
        prompt = first.rindex("<|im_start|>user")  # what comes before the task is context
        return self._encode([(first[:prompt], None), (first[prompt:], False), (turn, True),
                             (full[len(first + turn):], False), (DONE_TEXT + self._end, True)])

    def _context(self) -> Context:
        rng, spec = self._rng, self._spec
        shell = rng.choices(SHELL_TOOLS, weights=spec.shell_weights)[0]
        tools = [shell_tool(*shell)]
        if rng.random() < 0.6:
            tools = tools + [_function_tool(*t) for t in rng.sample(OTHER_TOOLS, rng.randint(1, len(OTHER_TOOLS)))]
            rng.shuffle(tools)
        if rng.random() < spec.no_tools_rate:
            tools = []
        if rng.random() < spec.long_prompt_rate:
            system = self._filler(rng.randint(spec.long_prompt_tokens // 4, spec.long_prompt_tokens))
        elif rng.random() < 0.8:
            system = rng.choice(SHORT_SYSTEMS)
        else:
            system = None
        # Some agents wrap the task (Claude Code: a reminder before it, a system message with the environment
        # after it): the model learns that shape on short prompts too.
        prefix = rng.choice(TASK_PREFIXES) if rng.random() < 0.25 else ""
        after = ()
        if rng.random() < 0.25:
            after = ({"role": "system", "content": self._scramble(rng.choice(AFTER_SYSTEMS))},)
        if rng.random() < SHELL_MENTION_RATE:
            mention = rng.choice(SHELL_MENTIONS).format(shell=rng.choice(SHELL_WORDS))
            place = rng.randrange(3)  # the system prompt, before the task, or a system message after it
            if place == 0:
                system = f"{system}\n{mention}" if system else mention
            elif place == 1:
                prefix = f"{prefix}{mention}\n\n"
            else:
                after = (*after, {"role": "system", "content": mention})
        return Context(before=({"role": "system", "content": system},) if system else (), tools=tuple(tools),
                       shell=shell, task_prefix=prefix, after=after)

    def _task(self, n: int) -> dict:
        rng = self._rng
        task = rng.choice(TASKS).format(n=n)
        if rng.random() < 0.3:
            task = task[:task.index(str(n)) + len(str(n))] + rng.choice(("", " ", ", ", ". ")) + rng.choice(self._words)
        parts = [task]
        for _ in range(rng.choice((0, 0, 1, 2))):
            parts.insert(rng.randint(0, len(parts)), rng.choice(DISTRACTIONS).format(m=self._number()))
        return {"role": "user", "content": " ".join(parts)}

    def _number(self) -> int:
        return int(self._digits(self._rng.choice((1, 2, 2, 3, 3, 3, 4, 4, 5, 6))))

    def _vary(self, text: str) -> str:
        """An agent's text as another run would send it: other digits, another rollout directory (the captures
        write it `/tmp/interceptor-rollout`; a run has a random suffix, under the sandboxes' directory or not)."""
        rng = self._rng
        suffix = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789_") for _ in range(8))
        root = rng.choice(("/tmp/interceptor-sandboxes/interceptor-rollout-", "/tmp/interceptor-rollout-")) + suffix
        return self._scramble(text).replace(_CAPTURED_ROLLOUT_DIR, root)

    def _scramble(self, text: str) -> str:
        """The text with every run of digits replaced by random digits of the same length."""
        return _DIGITS.sub(lambda match: self._digits(len(match.group())), text)

    def _digits(self, count: int) -> str:
        first = self._rng.choice("123456789") if count > 1 else self._rng.choice("0123456789")
        return first + "".join(self._rng.choice("0123456789") for _ in range(count - 1))

    def _perturb(self, n: int) -> int:
        text = list(str(n))
        i = self._rng.randrange(len(text))
        text[i] = self._rng.choice([d for d in "0123456789" if d != text[i] and (i or d != "0" or len(text) == 1)])
        return int("".join(text))

    def _filler(self, tokens: int) -> str:
        """About `tokens` tokens of agent-prompt-like text (counted in tokens: the small test vocabulary needs
        several per word)."""
        rng = self._rng
        lines, length = [], 0
        while length < 12 * tokens:  # enough characters for any vocabulary, cut to size below
            sentence = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(5, 16))]
            if rng.random() < 0.2:
                sentence.insert(rng.randrange(len(sentence)), str(self._number()))
            lines.append(("- " if rng.random() < 0.4 else "") + " ".join(sentence).capitalize() + ".")
            length += len(lines[-1]) + 1
        ids = self._tokenizer.encode("\n".join(lines), add_special_tokens=False)[:tokens]
        return self._tokenizer.decode(ids)

    def _render(self, messages: list[dict], tools: list[dict] | None) -> str:
        return self._tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=True
        )

    def _encode(self, pieces: list[tuple[str, bool | None]]) -> Episode:
        """Pieces of text: targets (True), prompt (False), or context (None: prompt run without gradient, only
        honoured at the start). Every piece starts right after a special token or is one, so encoding them apart
        gives the ids that encoding the whole text would."""
        ids: list[int] = []
        mask: list[bool] = []
        context = 0
        for text, target in pieces:
            encoded = self._encode_context(text) if target is None else self._encode_turns(text)
            if target is None and len(ids) == context:
                context += len(encoded)
            ids += encoded
            mask += [bool(target)] * len(encoded)
        return Episode(ids=ids, mask=mask, context=context)

    def _encode_turns(self, text: str) -> list[int]:
        """The ids of `text`, cut after each end-of-turn token: long turns are remembered (`ChunkIds`), the others
        encoded each time. Special tokens are split off before BPE, so the parts give the whole text's ids."""
        return self._turn_ids.encode(cut_after(text, self._end),
                                     lambda texts: [self._tokenizer.encode(t, add_special_tokens=False) for t in texts])
