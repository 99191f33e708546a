"""The test suite's heartbeat plugin (tests/heartbeat.py), run on slow tests in a pytest of their own."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(folder: Path, *options: str) -> subprocess.CompletedProcess:
    """pytest on ``folder``'s tests with the heartbeat every second, its cache in ``folder``; its stdout kept."""
    argv = [sys.executable, "-m", "pytest", "-q", *options, "-p", "tests.heartbeat", "--heartbeat", "1",
            "-o", "addopts=", "-o", f"cache_dir={folder / 'cache'}", "--rootdir", str(folder), str(folder)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=folder)


def test_a_long_test_reports_itself_while_it_runs_with_last_times_duration(tmp_path):
    slow = "import time\n\ndef test_slow():\n    time.sleep(2.6)\n\ndef test_next():\n    pass\n"
    (tmp_path / "test_slow.py").write_text(slow)
    first = run_pytest(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    beats = re.findall(r"test_slow.py::test_slow running for (\d) s; 2 tests to go\n", first.stdout)  # no history
    assert len(beats) >= 2 and beats[0] < beats[1], first.stdout
    assert "test_next running" not in first.stdout  # a quick test says nothing
    second = run_pytest(tmp_path)
    pattern = r"test_slow running for \d s \(took 3 s last time\); 2 tests to go, about \d s left\n"
    assert re.search(pattern, second.stdout), second.stdout


def test_under_xdist_the_controller_reports_each_long_test_of_every_worker(tmp_path):
    slow = "import time\n\ndef test_a():\n    time.sleep(2.6)\n\ndef test_b():\n    time.sleep(2.6)\n"
    (tmp_path / "test_both.py").write_text(slow)
    first = run_pytest(tmp_path, "-n", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    for name in ("test_a", "test_b"):  # the two run side by side on two workers, and both are reported
        assert re.search(rf"test_both.py::{name} running for \d s; \d tests to go\n", first.stdout), first.stdout
    second = run_pytest(tmp_path, "-n", "2")
    # one second in, the two tests under way have about 2 s each to go; two workers share them: about 2 s left
    # (4 s for one worker)
    pattern = r"test_a running for 1 s \(took 3 s last time\); 2 tests to go, about (\d) s left\n"
    left = re.findall(pattern, second.stdout)
    assert left and int(left[0]) <= 2, second.stdout


def test_a_test_whose_worker_crashed_is_no_longer_reported(tmp_path):
    tests = (
        "import os, time\n\ndef test_crash():\n    time.sleep(1.5)\n    os._exit(1)\n\n"
        "def test_slow():\n    time.sleep(5)\n"
    )
    (tmp_path / "test_crash.py").write_text(tests)
    result = run_pytest(tmp_path, "-n", "2")
    assert result.returncode == 1 and "crashed" in result.stdout, result.stdout + result.stderr
    assert re.search(r"test_slow running for 4 s; 1 tests to go\n", result.stdout), result.stdout
    assert not re.search(r"test_crash running for [3-9] s", result.stdout), result.stdout
