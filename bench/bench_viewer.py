"""How fast `interceptor view` opens a big run: N records (100,000 by default) written as the recorder writes them,
then, from this separate process, `interceptor view FILE --port 0` started and timed to its first answer (the
index built), the table's queries timed over HTTP (a page, a filter, a sort), one rollout opened, and, where
Chromium and Playwright are installed, the page loaded in a headless browser to its first rows.

    .venv/bin/python bench/bench_viewer.py                       # 100,000 records of ~1.2k tokens
    .venv/bin/python bench/bench_viewer.py --records 20000 --tokens 4000 --json runs/bench-viewer.json

Each record is a real `RolloutRecord` (two samples, one of them a fork, a trace of two chat calls); records differ
in task, status, reward and tokens. The file is written once to --dir (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from interceptor.store.records import Failure, RolloutRecord, SampleRecord, TurnRecord  # noqa: E402


def _sample(index: int, tokens: int, rng: random.Random, fork: bool) -> SampleRecord:
    ids = [rng.randrange(151_000) for _ in range(tokens)]
    mask, logprobs, turns, at = [0] * tokens, [0.0] * tokens, [], 0
    for turn in range(4):  # four turns: a prompt span then ~24 sampled tokens each
        start = at + (tokens // 4) - 24
        for i in range(start, start + 24):
            mask[i], logprobs[i] = 1, -rng.random()
        turns.append(TurnRecord(prompt_start=at, completion_start=start, completion_end=start + 24,
                                finish_reason="tool_calls", malformed_tool_call=False, model="policy",
                                policy_version=turn, seconds=0.1))
        at = start + 24
    return SampleRecord(index=index, input_ids=ids, completion_mask=mask, old_logprobs=logprobs, turns=turns,
                        auxiliary=False, fork_reason="history rewritten" if fork else None)


def write_records(path: Path, count: int, tokens: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    samples = [_sample(i, tokens // 2, rng, fork=i == 1) for i in range(2)]  # token arrays shared: writing is the cost
    trace = [{"new_messages": [{"role": "user", "content": "What is 2 + 3?"}],
              "response": {"role": "assistant", "content": "answer 5"}, "finish_reason": "stop"}] * 2
    with open(path, "wb") as f:
        for i in range(count):
            failed = i % 17 == 0
            record = RolloutRecord(
                rollout_id=f"{i:016x}", mode="interception_gate", status="failed" if failed else "ok",
                samples=samples, trace=trace, usage={"prompt_tokens": tokens - 192, "completion_tokens": 192,
                                                     "turns": 8},
                answer=str(i % 10), reward=None if failed else float(i % 3 == 0),
                failure=Failure(cause=("upstream", "agent", "sandbox")[i % 3], message="x") if failed else None,
                metadata={"task_id": f"task-{i % 500}", "agent": ("pi", "opencode", "codex", "claude")[i % 4],
                          "index": i % 8},
                started_at=1_800_000_000.0 + i, finished_at=1_800_000_010.0 + i)
            f.write(record.to_json() + b"\n")


def _get(url: str) -> tuple[float, dict]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        body = json.loads(response.read())
    return time.perf_counter() - started, body


def _timed(url: str, repeats: int = 5) -> float:
    return statistics.median(_get(url)[0] for _ in range(repeats))


def _browser(url: str) -> float | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path("/usr/bin/chromium").exists():
        return None
    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=args)
        page = browser.new_page()
        started = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("#rollouts tbody tr")
        seconds = time.perf_counter() - started
        browser.close()
    return seconds


def _listening(path: Path) -> tuple[float, str]:
    started = time.perf_counter()
    viewer = subprocess.Popen([sys.executable, "-m", "interceptor.cli", "view", str(path), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    line = viewer.stdout.readline()
    seconds = time.perf_counter() - started
    viewer.kill()
    viewer.wait()
    return seconds, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=1200, help="tokens per record (two samples)")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="bench-viewer-"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "rollouts.jsonl"
    started = time.perf_counter()
    write_records(path, args.records, args.tokens)
    written_s = time.perf_counter() - started
    size_mb = path.stat().st_size / 1e6

    empty = workdir / "empty.jsonl"
    empty.write_bytes(b"")
    floor_s = _listening(empty)[0]  # the same command on an empty file: process start and imports
    started = time.perf_counter()
    viewer = subprocess.Popen([sys.executable, "-m", "interceptor.cli", "view", str(path), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        line = viewer.stdout.readline()
        listening_s = time.perf_counter() - started
        match = re.search(r"at (http://\S+/) ", line)
        if not match:
            raise SystemExit(f"the viewer did not start: {line}{viewer.stdout.read()}")
        url = match.group(1)
        _, table = _get(url + "api/rollouts")
        first_answer_s = time.perf_counter() - started
        assert table["total"] == args.records, table["total"]
        results = {
            "records": args.records, "tokens_per_record": args.tokens, "file_mb": round(size_mb, 1),
            "write_s": round(written_s, 2),
            "open_to_listening_s": round(listening_s, 2),  # process start, imports, the index built
            "open_to_first_table_s": round(first_answer_s, 2),
            "empty_file_to_listening_s": round(floor_s, 2),  # the floor: the same command on an empty file
            "table_page_ms": round(1000 * _timed(url + "api/rollouts"), 1),
            "filter_task_ms": round(1000 * _timed(url + "api/rollouts?task=task-7"), 1),
            "filter_failed_sort_reward_ms": round(1000 * _timed(url + "api/rollouts?status=failed&sort=reward"), 1),
            "run_summary_ms": round(1000 * _timed(url + "api/run"), 1),
            "one_rollout_ms": round(1000 * _timed(url + f"api/rollouts/{args.records // 2:016x}"), 1),
        }
        browser_s = _browser(url)
        results["browser_first_rows_s"] = round(browser_s, 2) if browser_s is not None else "not run (no Chromium)"
    finally:
        viewer.kill()
        viewer.wait()
    width = max(map(len, results))
    for key, value in results.items():
        print(f"{key:>{width}}: {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
