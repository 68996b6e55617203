"""A command agent that takes its time (argv[1] seconds) before it chats once and submits the reply: long enough
for a test to lose the node it runs on while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from openai import OpenAI


def main() -> int:
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)
    reply = OpenAI().chat.completions.create(
        model=os.environ.get("OPENAI_MODEL", "policy"),
        messages=[{"role": "user", "content": sys.stdin.read()}],
        max_tokens=4,
    )
    subprocess.run(["answer", reply.choices[0].message.content or ""], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
