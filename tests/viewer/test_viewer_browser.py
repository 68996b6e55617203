"""The viewer in a real headless browser (Debian's Chromium driven by Playwright) over a real run: `interceptor view`
is opened on an empty run directory, `interceptor run` then runs a real agent (the OpenAI-SDK example agent) against
the embedded default policy on the local engine, and the page shows the rollouts as they are written, without a
reload. Then one rollout's token spans, and the table's filters. Screenshots go to `test-artifacts/viewer/` (or
`$INTERCEPTOR_TEST_ARTIFACTS/viewer/`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# As root in a closed network: no sandbox, and nothing that reaches for Google's hosts.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ROLLOUTS = 8  # 4 tasks x 2

pytestmark = pytest.mark.e2e


def _artifacts() -> Path:
    base = Path(os.environ.get("INTERCEPTOR_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    (base / "viewer").mkdir(parents=True, exist_ok=True)
    return base / "viewer"


def _require_browser():
    message = None
    if not CHROMIUM.exists():
        message = "no Chromium at /usr/bin/chromium (scripts/setup-browser.sh installs it)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            message = "playwright is not installed (pip install -e '.[dev]')"
    if message:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return sync_playwright


def _start_viewer(out: Path, model: Path | None = None) -> tuple[subprocess.Popen, str]:
    tokenizer = ["--model", str(model)] if model is not None else []
    viewer = subprocess.Popen([sys.executable, "-m", "interceptor.cli", "view", str(out), "--port", "0",
                               "--poll", "0.2", *tokenizer], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT)  # fmt: skip
    line = viewer.stdout.readline()
    match = re.search(r"at (http://\S+/) ", line)
    if not match:
        viewer.kill()
        raise AssertionError(f"the viewer did not say where it listens: {line!r}{viewer.stdout.read()}")
    return viewer, match.group(1)


@contextmanager
def browser_page(sync_playwright, url: str) -> Iterator[tuple[object, list[str]]]:
    """Headless Chromium on `url`, and the page errors it reports."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        yield page, errors
        browser.close()


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory, tool_model_dir):
    """The page, opened before the run started, and what it showed while the run wrote its records."""
    sync_playwright = _require_browser()
    out = tmp_path_factory.mktemp("viewed-run")
    viewer, url = _start_viewer(out)
    try:
        with browser_page(sync_playwright, url) as (page, errors):
            page.wait_for_function("document.body.dataset.rollouts === '0'")
            page.evaluate("window.__openedOnce = true")  # gone if the page reloads
            agent = f"{sys.executable} {ROOT / 'examples/agents/simple_agent.py'}"
            run = subprocess.Popen(
                [sys.executable, "-m", "interceptor.cli", "run", "--agent", "command", "--command", agent,
                 "--tasks", str(ROOT / "examples/tasks/arithmetic.jsonl"), "--upstream", "local",
                 "--model", str(tool_model_dir), "-n", "2", "--concurrency", "1", "--sandbox", "local",
                 "--out", str(out)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
            seen: list[int] = []
            deadline = time.monotonic() + 600  # a bound for a stuck run, not a speed requirement
            while run.poll() is None and time.monotonic() < deadline:
                seen.append(int(page.evaluate("document.body.dataset.rollouts || '0'")))
                page.wait_for_timeout(100)
            output = run.communicate(timeout=60)[0]
            assert run.returncode == 0, output
            page.wait_for_function(f"document.body.dataset.rollouts === '{ROLLOUTS}'", timeout=30_000)
            page.wait_for_function(f"document.querySelectorAll('#rollouts tbody tr').length === {ROLLOUTS}")
            page.screenshot(path=str(_artifacts() / "run.png"), full_page=True)
            records = [orjson.loads(line) for line in (out / "rollouts.jsonl").read_bytes().splitlines()]
            yield {"page": page, "seen": seen, "records": records, "errors": errors, "out": out}
    finally:
        viewer.kill()
        viewer.wait()


def test_rollouts_appear_on_the_open_page_as_the_run_writes_them(watched_run):
    page, seen = watched_run["page"], watched_run["seen"]
    assert page.evaluate("window.__openedOnce") is True  # no reload happened
    growth = sorted(set(seen) - {0, ROLLOUTS})
    assert growth, f"the page went from 0 to {ROLLOUTS} rollouts with nothing between: {Counter(seen)}"
    assert seen == sorted(seen)  # it only ever grew
    cards = page.inner_text("#summary")
    assert f"{ROLLOUTS}\nrollouts" in cards
    assert watched_run["errors"] == []


def test_a_rollout_shows_its_sampled_tokens_shaded_with_their_logprobs(watched_run):
    page, records = watched_run["page"], watched_run["records"]
    graded = [r for r in records if r["status"] == "ok" and r["samples"]]
    assert graded, "the run produced no rollout with samples"
    record = max(graded, key=lambda r: sum(len(s["turns"]) for s in r["samples"]))
    page.fill("#filters input[name=q]", record["rollout_id"])
    page.wait_for_function("document.querySelectorAll('#rollouts tbody tr').length === 1")
    page.click("#rollouts tbody tr")
    page.wait_for_selector("#sample-list .tok")
    tokens = page.query_selector_all("#sample-list .tok")
    expected = [(i, lp) for s in record["samples"]
                for i, lp, m in zip(s["input_ids"], s["old_logprobs"], s["completion_mask"]) if m]
    assert len(tokens) == len(expected)
    shown = [float(t.get_attribute("data-logprob")) for t in tokens]
    assert shown == pytest.approx([lp for _, lp in expected], abs=1e-12)
    title = tokens[0].get_attribute("title")
    assert f"id {expected[0][0]}" in title and "logprob" in title
    assert page.locator("#sample-list .span-prompt").count() >= sum(len(s["turns"]) for s in record["samples"])
    marks = page.locator("#sample-list .turn-mark").count()
    assert marks == sum(len(s["turns"]) for s in record["samples"])
    assert "<|im_start|>" in page.inner_text("#sample-list .span-prompt >> nth=0")  # decoded with the tokenizer
    assert page.locator("#messages .msg.user").count() >= 1
    page.screenshot(path=str(_artifacts() / "rollout.png"), full_page=False)
    page.click("#back")
    page.wait_for_selector("#run-view:not([hidden])")
    page.fill("#filters input[name=q]", "")


def test_the_table_filters_by_task_and_reward(watched_run):
    page, records = watched_run["page"], watched_run["records"]
    task = records[0]["metadata"]["task_id"]
    page.select_option("#filters select[name=task]", task)
    wanted = sum(r["metadata"]["task_id"] == task for r in records)
    page.wait_for_function(f"document.querySelectorAll('#rollouts tbody tr').length === {wanted}")
    assert set(page.locator("#rollouts tbody tr td:nth-child(3)").all_inner_texts()) == {task}
    page.select_option("#filters select[name=task]", "")
    page.fill("#filters input[name=min_reward]", "1")
    rewarded = sum((r["reward"] or 0) >= 1 for r in records)
    page.wait_for_function(
        f"document.querySelector('#page-info').textContent.includes('of {rewarded}')"
        if rewarded else "document.querySelector('#page-info').textContent === 'no rollouts match'")
    page.screenshot(path=str(_artifacts() / "filtered.png"), full_page=False)
    page.fill("#filters input[name=min_reward]", "")
