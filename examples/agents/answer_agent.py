"""The smallest agent: ask the model once, submit its reply with the `answer` command.

For `interceptor run --agent command` / `interceptor train` with `agent = "command"`: reads the task on stdin and
OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL from the environment, like any OpenAI SDK program.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from openai import OpenAI


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    reply = OpenAI().chat.completions.create(
        model=os.environ.get("OPENAI_MODEL", "policy"),
        messages=[{"role": "user", "content": sys.stdin.read().strip()}],
        max_tokens=args.max_tokens,
    )
    text = reply.choices[0].message.content or ""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}  # the answer command needs no key
    return subprocess.run(["answer"], input=text, text=True, env=env).returncode  # stdin: any text, even NUL


if __name__ == "__main__":
    sys.exit(main())
