"""Custom reward functions in a worker process: failures become ``None`` and a counted reason, never an exception."""

import os
import time
from pathlib import Path

import pytest

from nibble.tasks.rewards import FAILURE_REASONS, RewardRunner

BEHAVES = "tests.nibble.tasks.reward_fixtures:behaves"
TIMEOUT = 3.0  # seconds: a call that answers at once must never miss it on a busy 2-core CI machine


@pytest.fixture
def runner():
    with RewardRunner(BEHAVES, timeout=TIMEOUT) as runner:
        yield runner


def test_scores_pass_through_and_batch_in_order(runner):
    items = [("p", "42", "42"), ("p", "41", "42"), ("p", "print", "x")]
    assert runner.score_many(items) == [1.0, 0.0, 0.5]
    assert runner.score("p", "7", "7") == 1.0
    assert runner.counts == dict.fromkeys(FAILURE_REASONS, 0)


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("raise", "exception"),
        ("hang", "timeout"),
        ("nan", "non_finite"),
        ("inf", "non_finite"),
        ("string", "not_a_number"),
        ("exit", "worker_died"),
    ],
)
def test_a_failing_call_yields_none_counts_its_reason_and_the_runner_keeps_working(runner, response, reason):
    start = time.monotonic()
    assert runner.score("p", response, "a") is None
    assert time.monotonic() - start < TIMEOUT + 7  # a hung call costs the timeout plus a kill, not an hour
    assert runner.counts == {**dict.fromkeys(FAILURE_REASONS, 0), reason: 1}
    assert runner.score_many([("p", "a", "a"), ("p", "b", "a")]) == [1.0, 0.0]


def test_a_batch_with_failures_scores_the_rest(runner):
    items = [("p", "a", "a"), ("p", "hang", "a"), ("p", "raise", "a"), ("p", "exit", "a"), ("p", "b", "b")]
    assert runner.score_many(items) == [1.0, None, None, None, 1.0]
    assert (runner.counts["timeout"], runner.counts["exception"], runner.counts["worker_died"]) == (1, 1, 1)


def test_close_stops_the_worker_and_later_calls_are_refused():
    runner = RewardRunner(BEHAVES, timeout=0.5)
    pid = runner.pid
    assert pid is not None
    runner.close()
    runner.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ValueError, match="closed"):
        runner.score("p", "a", "a")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon", "must look like 'package.module:function'"),
        ("a:b:c", "must look like"),
        (":behaves", "must look like"),
        ("tests.nibble.tasks.no_such_module:f", "cannot import 'tests.nibble.tasks.no_such_module'"),
        ("tests.nibble.tasks.reward_fixtures:missing", "has no attribute 'missing'"),
        ("tests.nibble.tasks.reward_fixtures:not_callable", "'not_callable' is not callable"),
    ],
)
def test_a_bad_import_path_is_a_value_error_naming_it(path, message):
    with pytest.raises(ValueError, match=message) as info:
        RewardRunner(path)
    assert repr(path) in str(info.value)


def test_a_module_that_hangs_on_import_fails_construction_instead_of_hanging():
    path = "tests.nibble.tasks.reward_fixtures_slow_import:reward"
    with pytest.raises(ValueError, match="did not start in time"):
        RewardRunner(path, startup_timeout=1.0)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "5"])
def test_timeout_must_be_a_positive_number(timeout):
    with pytest.raises(ValueError, match="timeout="):
        RewardRunner(BEHAVES, timeout=timeout)


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a killed orphan may wait for a reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_timeout_also_kills_processes_the_function_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    # 2 s: time for the function to start its child and write the pid file before the call times out, even
    # on a busy 2-core CI machine (the child's death is then awaited separately, up to 5 s)
    with RewardRunner("tests.nibble.tasks.reward_fixtures:spawns_and_hangs", timeout=2.0) as runner:
        assert runner.score("p", str(pid_file), "a") is None
        child = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and running(child):
            time.sleep(0.05)
        assert not running(child)
