"""A task whose reward varies even under a random policy, for training tests: the agent chats once and submits
the model's reply; the reward is 1 when the reply has an even number of characters. An argument makes the agent wait
that many seconds first (long enough for a test to lose the node it runs on while it runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from openai import OpenAI


def grade(task, answer, workspace) -> float:
    return 1.0 if len(str(answer)) % 2 == 0 else 0.0


def main() -> int:
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)
    client = OpenAI()
    reply = client.chat.completions.create(
        model=os.environ.get("OPENAI_MODEL", "policy"),
        messages=[{"role": "user", "content": sys.stdin.read()}],
        max_tokens=8,
    )
    subprocess.run(["answer", reply.choices[0].message.content or ""], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
