"""Push a finished run to the Hugging Face Hub: the trained policy (`OUT/final/`) as a model repository, with the
run's records beside it under `run/` (rollouts.jsonl, metrics.jsonl, setup.json, reward.png).

    HF_TOKEN=... SPACE_PUSH_REPO=user/name python space_app/push.py OUT

Without HF_TOKEN or SPACE_PUSH_REPO it says so and pushes nothing (exit 0). The token is read from the environment
only and never printed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

RUN_FILES = ("rollouts.jsonl", "metrics.jsonl", "setup.json", "reward.png")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: push.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[0])
    token, repo = os.environ.get("HF_TOKEN"), os.environ.get("SPACE_PUSH_REPO")
    if not token or not repo:
        print("[push] HF_TOKEN and SPACE_PUSH_REPO are not both set: nothing pushed", file=sys.stderr)
        return 0
    final = out / "final"
    if not final.is_dir():
        print(f"[push] {final} is missing (the run did not finish): nothing pushed", file=sys.stderr)
        return 1
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo, repo_type="model", exist_ok=True, private=True)
    api.upload_folder(repo_id=repo, folder_path=str(final), commit_message="the policy trained by interceptor train")
    for name in RUN_FILES:
        if (out / name).is_file():
            api.upload_file(repo_id=repo, path_or_fileobj=str(out / name), path_in_repo=f"run/{name}",
                            commit_message=f"run/{name}")
    print(f"[push] pushed {final} and the run's records to https://huggingface.co/{repo}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
