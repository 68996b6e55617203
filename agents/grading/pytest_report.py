"""A pytest plugin that reports each test's outcome as a JSON line to the file INTERCEPTOR_REPORT names.

Copied into the box a rollout is graded in and loaded with `-p`: the grade is read from this file, not from what the
tested process prints (code under test can print `PASSED <id>`). The variable is taken out of the environment when
pytest configures, before any test module or `conftest.py` is imported; a run that ends before pytest finishes
(`os._exit`, a crash, a timeout) leaves no `finished` line and is not a complete report. Stdlib and pytest only.
"""

import json
import os

_report = None


def pytest_configure(config):
    global _report
    path = os.environ.pop("INTERCEPTOR_REPORT", None)
    if path and _report is None:
        _report = open(path, "w", buffering=1, encoding="utf-8")  # noqa: SIM115  (open for the whole session)


def pytest_runtest_logreport(report):
    if _report is None:
        return
    if report.passed and report.when != "call":
        return
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    else:
        outcome = report.outcome  # passed, failed, skipped
    _report.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": outcome}) + "\n")


def pytest_sessionfinish(session, exitstatus):
    if _report is not None:
        _report.write(json.dumps({"finished": int(exitstatus)}) + "\n")
        _report.flush()
