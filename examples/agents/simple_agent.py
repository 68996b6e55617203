"""A minimal tool-using agent over the OpenAI SDK, for `interceptor run --agent command`.

It reads the task on stdin, offers the model one tool, `bash` (argument `command`), runs every call in the current
directory, sends the output back, and stops when the model answers without a tool call or after --max-turns.
It reads OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL like any OpenAI SDK program, and removes them from the
environment of the commands it runs, so the model's credential never reaches them.

`--shots FILE` puts worked examples before the task: a JSON list of OpenAI chat messages (user turns, assistant
turns with `tool_calls`, tool results), sent as the start of every request's history, as few-shot prompting does.
`interceptor make-tasks` writes one for each task family. `--print-prefix` prints what goes before every task
(`{"messages": [system, *shots], "tools": [...]}`) and exits: `interceptor warm-start` teaches in that context.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the task's directory and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command line"}},
                "required": ["command"],
            },
        },
    }
]
SYSTEM = "You are a coding agent. Use the bash tool to act. Submit results with the `answer` command."


def run_tool(arguments: str) -> str:
    try:
        command = json.loads(arguments)["command"]
    except (ValueError, KeyError, TypeError):
        return "error: the bash tool takes {\"command\": \"...\"}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60, env=env)
    return (done.stdout + done.stderr)[-4000:] or f"(exit {done.returncode}, no output)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--shots", help="a JSON file: worked examples (chat messages) put before the task")
    parser.add_argument("--print-prefix", action="store_true", help="print the messages and tools put before "
                        "every task, as JSON, and exit")
    args = parser.parse_args()
    shots = json.loads(open(args.shots, encoding="utf-8").read()) if args.shots else []
    if not isinstance(shots, list) or not all(isinstance(m, dict) and "role" in m for m in shots):
        parser.error("--shots must hold a JSON list of chat messages")
    prefix = [{"role": "system", "content": SYSTEM}, *shots]
    if args.print_prefix:
        print(json.dumps({"messages": prefix, "tools": TOOLS}, indent=1))
        return 0
    client = OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL", "policy")
    messages = [*prefix, {"role": "user", "content": sys.stdin.read().strip()}]
    for _ in range(args.max_turns):
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=args.max_tokens
        ).choices[0].message
        messages.append(reply.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        if not reply.tool_calls:
            print(reply.content or "")
            return 0
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.arguments)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
