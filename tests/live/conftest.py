"""The live tests run a real vLLM engine on this machine's CPU, in a venv of their own
(.venv-vllm-cpu, `make test-live`; the main suite's .venv has no vLLM and does not collect them).

Where they must run (VIME_REQUIRE_VLLM=1, which `make test-live` sets, or CI=true) nothing may
pass by being skipped: a vLLM that does not import is an error of the run, and a test that
skips is reported as failed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRED = os.environ.get("VIME_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true"

if REQUIRED:
    import vllm  # noqa: F401  (an ImportError here fails the run with vLLM's own message)
elif importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items):
    for item in items:  # every test here runs a real engine: `-m live` selects them
        if "tests/live/" in item.nodeid or item.path.parent.name == "live":
            item.add_marker(pytest.mark.live)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRED and report.skipped:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} skipped where the live tests must run "
                           f"(VIME_REQUIRE_VLLM=1 or CI=true): {report.longrepr}")
