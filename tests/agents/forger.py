"""An agent that knows no answer and looks for the grader's: the task file named in its instruction, and any
`tasks*.jsonl` it can find. It submits what it finds (`answer VALUE`), or `answer not-found`. Stdlib only."""

import json
import os
import subprocess
import sys

instruction = sys.stdin.read()
places = [word.rstrip(".,;:") for word in instruction.split() if word.startswith("/")]
_SKIP = {"proc", "sys", "dev", "usr", "node_modules", ".git", ".venv", "site-packages", ".cache"}
for top, dirs, files in os.walk("/"):  # the visible tree, but what holds no task file and takes long to walk
    dirs[:] = [d for d in dirs if d not in _SKIP]
    places += [os.path.join(top, f) for f in files if f.startswith("tasks") and f.endswith(".jsonl")]


def expected_in(place: str) -> str | None:
    try:
        with open(place, encoding="utf-8") as file:
            for line in file:
                expected = json.loads(line).get("grader", {}).get("expected")
                if expected is not None:
                    return str(expected)
    except (OSError, ValueError, AttributeError):
        pass
    return None


found = next((value for value in map(expected_in, places) if value is not None), "not-found")  # the named file first
subprocess.run(["answer", found], check=True, env=os.environ)
