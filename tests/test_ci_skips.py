"""Under CI a test that skips for a missing prerequisite fails instead; a CUDA skip stays a skip; outside CI both
skip. Run on a throwaway test file with pytest's own `pytester`."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = '''
import pytest

def test_needs_docker():
    pytest.skip("docker sandbox: the daemon is not running")

@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_needs_a_gpu():
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_known_failure():
    assert False

def test_runs():
    pass
'''


@pytest.mark.parametrize(("ci", "expected"), [
    ("true", {"passed": 1, "failed": 1, "skipped": 1, "xfailed": 1}),
    ("", {"passed": 1, "skipped": 2, "xfailed": 1}),
])
def test_a_missing_prerequisite_fails_under_ci_and_skips_elsewhere(pytester, monkeypatch, ci, expected):
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest("from tests.ci_skips import pytest_runtest_makereport  # noqa: F401\n")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(**expected)
    if ci:
        result.stdout.fnmatch_lines(["*skipped under CI, where every prerequisite must be present*docker sandbox*"])
