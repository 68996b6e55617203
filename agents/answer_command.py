"""The `answer` command an agent runs to submit its result: `answer 42` posts `{"answer": "42"}` to its rollout's
`tools/answer` endpoint and prints the server's acknowledgement (never a reward).

The script is written per rollout into a directory put first on the agent's `PATH`, with the rollout's tools URL
and its *tools* secret baked in (mode 0700). The tools secret opens only `/tools/*`: programs the agent runs hold
no credential to the model. It uses only the Python standard library, run by the box's Python
(`Sandbox.script_python`: this host's interpreter where the box shares it, the image's in a container).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from agents.specs.spec import BoxFile, write_box_files

__all__ = ["answer_command", "write_answer_command"]

_SCRIPT = '''#!{python}
"""Submit an answer for this task: answer <value>. (Written by interceptor for one rollout.)"""
import json, sys, time, urllib.error, urllib.request

value = " ".join(sys.argv[1:]) if len(sys.argv) > 1 else sys.stdin.read().strip()
body = json.dumps({{"answer": value}}).encode()
headers = {{"Authorization": "Bearer " + {secret!r}, "Content-Type": "application/json"}}
deadline, pause = {deadline!r}, 0.5
while True:  # a busy or restarting server is waited for until the rollout's own limit, never given up on sooner
    left = deadline - time.time()
    try:
        request = urllib.request.Request({url!r}, data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=max(1.0, left)) as response:
            print(json.loads(response.read()).get("message", "answer recorded"))
            sys.exit(0)
    except urllib.error.HTTPError as error:
        if error.code not in (429, 502, 503, 504):
            print("answer was not accepted:", error.read().decode(errors="replace"), file=sys.stderr)
            sys.exit(1)
        problem = error
    except OSError as error:
        problem = error
    if time.time() + pause > deadline:
        print("could not reach the grader before the rollout's limit:", problem, file=sys.stderr)
        sys.exit(75)
    time.sleep(pause)
    pause = min(pause * 2, 8.0)
'''


def answer_command(bin_dir: Path, *, base_url: str, tools_secret: str, python: str = sys.executable,
                   deadline_s: float = 600.0) -> BoxFile:
    """`bin_dir/answer` for the rollout whose OpenAI base URL is `base_url` (ending in `/v1`), run by `python` (a
    shebang's program), for the sandbox to write (`Sandbox.put_files`). It waits for the server (retrying refused
    connections and 429/5xx replies) until `deadline_s` from now: the rollout's own wall-clock limit."""
    script = _SCRIPT.format(python=python, url=f"{base_url}/tools/answer", secret=tools_secret,
                            deadline=round(time.time() + deadline_s, 3))
    return BoxFile(bin_dir / "answer", script.encode(), 0o700)


def write_answer_command(bin_dir: Path, *, base_url: str, tools_secret: str, deadline_s: float = 600.0) -> Path:
    """Write `bin_dir/answer` through this host's file system (a box that shares it; tests)."""
    command = answer_command(bin_dir, base_url=base_url, tools_secret=tools_secret, deadline_s=deadline_s)
    write_box_files((command,), bin_dir)
    return command.path
