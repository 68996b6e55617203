"""Under CI (`CI=true`, as `.ci/run` sets it) a skipped test is a failure, unless its reason names what no CI machine
here has (a CUDA GPU). A suite whose prerequisite is missing (the namespace sandbox, Docker and its image, cgroups,
vLLM, an agent, a browser) must not pass for one that ran; outside CI it still skips, saying what is missing.

`tests/conftest.py` imports the hook, so it applies to the whole suite."""

from __future__ import annotations

import os

import pytest

__all__ = ["ALLOWED_IN_CI", "pytest_runtest_makereport"]

ALLOWED_IN_CI = ("CUDA",)  # skips whose reason names one of these stay skips under CI


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _under_ci()) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(word in reason for word in ALLOWED_IN_CI):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every prerequisite must be present: {reason}"
