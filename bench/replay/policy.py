"""A scripted policy that does a coding agent's work on a real source tree, for recording agent-shaped sessions.

It is a `/v1/completions` server (vLLM's contract, token ids in and out) behind the interception gate. Each call's
prompt is decoded, and the reply is the next step of a session's work, as a tool call to the agent's shell tool in
Qwen's format, with a sentence or two of reasoning before it:

    read 150-250 lines of the next source file (most steps), grep the tree for a name, edit a file with sed, write
    a unittest and run it; after `steps` steps a short report (no tool call), which ends the agent's run. Every
    command ends by echoing the session's tag and step, so no two turns of the corpus end alike.

At step SUBAGENT_STEP, an agent with a sub-agent tool (OpenCode's `task`) hands a brief of a
few steps to a sub-agent, whose chain the policy knows by that brief and works through apart.
The session is named in its instruction ("Session S-..."); the policy keeps each session's step count, so a
compaction (a summary request, answered with a summary that names the session) resumes the work where it was
instead of starting over. A request without the shell tool (a title, a summary) gets plain text. Every reply is
kept (`completions`: `prompt_key` -> the ids and logprobs sampled), so a replay can answer the gate the same way.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web

from bench.peers.serving import start_app

__all__ = ["SHELL_TOOLS", "WorkPolicy", "prompt_key"]

# The agents' shell tools, as their requests name them, and the argument that holds the command
SHELL_TOOLS = (("exec_command", "cmd"), ("Bash", "command"), ("bash", "command"))
KEY_IDS = 256  # a prompt is known by its last ids, its length and its number of messages
FIRST_MESSAGES = 6  # a prompt with at most this many messages is known by all its ids
TURN_MARK = "<|im_start|>"  # the chat template's message opener: counted, it tells turns that end alike apart
# The agents' sub-agent tools, called once a session at SUBAGENT_STEP with a brief of SUBAGENT_STEPS steps of work
# Not Claude Code's `Agent`: it runs the sub-agent in the background and tells the main chain in a system message
# when it ends, and the gate's prompts after that message are not yet reproduced in a replay (the replay model
# misses them), so Claude Code's sessions keep their work on the main chain.
SUBAGENT_TOOLS = (("task", {"subagent_type": "general"}),)
SUBAGENT_STEP, SUBAGENT_STEPS = 30, 3
_SESSION = re.compile(r"Session (S-[0-9a-f]+)")
_THOUGHTS = ("Let me look at {what} to see how it is put together.", "Next I will check {what}.",
             "{what} should tell me how the pieces connect.", "I still need to read {what} before changing anything.",
             "To be sure the change is safe, I will go through {what}.")


def prompt_key(prompt: list[int], turn_mark: int) -> str:
    """What a completion is found by: the prompt's length, how many messages it holds (its `<|im_start|>` tokens)
    and a digest of its last KEY_IDS ids (every tool output ends with its session's tag and step)."""
    messages = prompt.count(turn_mark)
    # before the first tool output the tail is the agent's own text (Claude Code's environment block), alike across
    # sessions: the whole prompt then (short) tells them apart
    return key_of(len(prompt), messages, prompt if messages <= FIRST_MESSAGES else prompt[-KEY_IDS:])


def key_of(length: int, messages: int, ids: list[int]) -> str:
    """`prompt_key` from its parts: the ids are the whole prompt or its last KEY_IDS, as `prompt_key` chooses."""
    return f"{length}:{messages}:{hashlib.blake2b(orjson.dumps(ids), digest_size=12).hexdigest()}"


@dataclass
class _Session:
    steps: int = 0
    summaries: int = 0


@dataclass
class WorkPolicy:
    """`async with WorkPolicy(tokenizer, tree_files, steps=80) as policy:` serves at `policy.url`."""

    tokenizer: object
    files: list[tuple[str, int]]  # the source tree's files (path relative to the workspace, lines)
    steps: int = 80
    max_model_len: int = 262_144
    completions: dict[str, dict] = field(default_factory=dict)
    sessions: dict[str, _Session] = field(default_factory=dict)
    url: str = ""

    async def __aenter__(self) -> WorkPolicy:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        self._runner, self.url = await start_app(app)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "work", "object": "model", "max_model_len": self.max_model_len}]})

    async def _complete(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        prompt = body["prompt"]
        text = self.reply(self.tokenizer.decode(prompt))
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        ids = ids[: body.get("max_tokens") or len(ids)]
        rng = random.Random(len(prompt))
        logprobs = [-rng.uniform(0.01, 3.0) for _ in ids]
        mark = self.tokenizer.convert_tokens_to_ids(TURN_MARK)
        self.completions[prompt_key(prompt, mark)] = {"ids": ids, "logprobs": logprobs}
        choice = {"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": None,
                  "logprobs": {"token_logprobs": logprobs}, "stop_reason": None,
                  "finish_reason": "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"}
        return web.Response(body=orjson.dumps({"model": "work", "choices": [choice],
                                               "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}),
                            content_type="application/json")

    # ------------------------------------------------------------------------------------------------ the script

    def reply(self, prompt: str) -> str:
        found = _SESSION.findall(prompt)
        first_user = prompt.split("<|im_start|>user", 1)[-1].split("<|im_end|>", 1)[0]
        sub = "Sub-task of Session" in first_user  # a sub-agent's chain: its brief is its task
        session = self.sessions.setdefault((found[0] if found else "-") + ("/sub" if sub else ""), _Session())
        last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
        shell = next(((name, arg) for name, arg in SHELL_TOOLS if f'"name": "{name}"' in prompt), None)
        # a compaction request: the agent's own instruction to summarise (not a tool result, not the task)
        summary = "summar" in last_user.lower() and "<tool_response>" not in last_user and "Session S-" not in last_user
        if summary or shell is None:
            if not summary:
                return "Reading the source tree"  # a title
            session.summaries += 1
            return (f"Summary of {found[0] if found else 'the session'}: the work so far read "
                    f"{session.steps} parts of the source tree, searched it, edited files and ran a unittest that "
                    "passed. Next: keep reading the remaining files in order, then report what was found.")
        if sub and session.steps >= SUBAGENT_STEPS:
            return f"Sub-task done: read {session.steps} parts; nothing in them needs changing."
        spawn = next(((name, extra) for name, extra in SUBAGENT_TOOLS if f'"name": "{name}"' in prompt), None)
        if not sub and spawn is not None and session.steps == SUBAGENT_STEP:
            session.steps += 1
            name, extra = spawn
            brief = (f"Sub-task of Session {found[0] if found else 'S-0'}: read the first 150 lines of "
                     f"{self.files[-1][0]} and of {self.files[-2][0]}, then say what they define.")
            call = {"name": name, "arguments": {"description": "read two small files", "prompt": brief, **extra}}
            return f"Two small files can be read aside.\n<tool_call>\n{orjson.dumps(call).decode()}\n</tool_call>"
        if session.steps >= self.steps:
            return (f"Done. I read {session.steps} parts of the tree, made {session.steps // 9} small edits and ran "
                    "the unittest after each; it passes.")
        step = session.steps
        session.steps += 1
        command, what = self._command(step, found[0] if found else "S-0")
        # the output ends with the session's tag: two sessions' turns never end alike (a replay finds a completion
        # by its prompt's tail)
        command += f"; echo '[{found[0] if found else 'S-0'}{'/sub' if sub else ''} {step}]'"
        rng = random.Random(step)
        thought = " ".join(rng.choice(_THOUGHTS).format(what=what) for _ in range(rng.randint(1, 3)))
        name, arg = shell
        return f"{thought}\n<tool_call>\n{orjson.dumps({'name': name, 'arguments': {arg: command}}).decode()}\n</tool_call>"

    def _command(self, step: int, session: str) -> tuple[str, str]:
        """The shell command of step `step`, and what it looks at."""
        kind = step % 9
        path, lines = self.files[(step // 9 * 6 + min(kind, 5)) % len(self.files)]
        if kind <= 5:
            start = 1 + (step * 97) % max(1, lines - 150)
            end = start + 150 + (step * 31) % 100
            return f"sed -n '{start},{end}p' {path}", f"lines {start}-{end} of {path}"
        package = self.files[0][0].split("/")[0]
        if kind == 6:
            pattern = ("def __init__", "raise ", "return self", "import ", "class ")[step % 5]
            return f"grep -rn '{pattern}' {package} | head -80", f"where {pattern.strip()!r} is used"
        if kind == 7:
            return (f"sed -i '1i # reviewed in {session}, step {step}' {path} && head -5 {path} && git diff --stat "
                    "2>/dev/null | tail -3", f"an edit to {path}")
        test = (f"import unittest\\nimport {package}\\n\\nclass Check(unittest.TestCase):\\n    def test_import(self):\\n"
                f"        self.assertTrue({package}.__name__)\\n")
        return (f"printf '{test}' > test_session.py && python3 -m unittest -v test_session 2>&1 | tail -15",
                "whether the package still imports")


def source_tree(package_dir: Path) -> list[tuple[str, int]]:
    """The Python files of a package directory, as (path under its parent, line count), largest first."""
    files = [(str(p.relative_to(package_dir.parent)), p.read_text(errors="replace").count("\n"))
             for p in sorted(package_dir.rglob("*.py"))]
    return sorted((f for f in files if f[1] >= 40), key=lambda f: -f[1])
