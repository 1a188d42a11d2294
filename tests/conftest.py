from __future__ import annotations

import os

import pytest
from specsupport import _preset_checkpoint


@pytest.fixture(scope="session", autouse=True)
def job_registry_of_this_run(tmp_path_factory):
    """`vime submit` remembers job ids in the user's registry (vime/launch/jobdir.py's
    registry(), ~/.local/state/vime): the test run's jobs go to a registry of its own, also for
    the commands its tests start."""
    saved = os.environ.get("VIME_STATE_DIR")
    os.environ["VIME_STATE_DIR"] = str(tmp_path_factory.mktemp("vime-state"))
    yield
    if saved is None:
        os.environ.pop("VIME_STATE_DIR", None)
    else:
        os.environ["VIME_STATE_DIR"] = saved


@pytest.fixture
def preset_checkpoint(tmp_path):
    """A folder with the config.json of a preset, as an HF checkpoint would have."""
    return _preset_checkpoint(tmp_path)


@pytest.fixture(autouse=True)
def ctrl_c_as_a_terminal_gives_it():
    """Each test starts with Python's own SIGINT handler, as a command typed in a terminal
    does: code run in the test process (the head node's teardown ignores SIGINT and SIGTERM)
    must not leave the next test's subprocesses ignoring Ctrl-C, which they inherit."""
    import signal
    import threading

    def default() -> None:
        if threading.current_thread() is threading.main_thread():  # where handlers are set
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    default()
    yield
    default()
