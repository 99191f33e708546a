"""Backoff, the per-message stall deadline, and token reading."""

import threading
import time

import pytest

from nibble.transport.weights.auth import read_token
from nibble.transport.weights.grpc_util import Backoff, StallWatchdog


def test_backoff_grows_exponentially_up_to_its_bound_and_resets():
    backoff = Backoff(initial=0.1, maximum=1.0, multiplier=2.0, jitter=0.0)
    assert [backoff.next_delay() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.1)
    jittered = Backoff(initial=1.0, jitter=0.2)
    assert all(0.8 <= jittered.next_delay() / 2**i <= 1.0 for i in range(3))


def test_backoff_wait_gives_up_when_stopped():
    stop = threading.Event()
    stop.set()
    assert Backoff(initial=10.0).wait(stop) is False


def test_the_watchdog_cancels_only_a_stalled_stream():
    cancelled = threading.Event()
    with StallWatchdog(2.0, cancelled.set) as watchdog:  # 20× the gaps below: a busy CI machine's stalls fit
        for _ in range(5):
            time.sleep(0.1)
            watchdog.progress()
        assert not cancelled.is_set()
        assert cancelled.wait(10.0)
    assert watchdog.stalled


def test_tokens_come_from_a_file_first_then_the_environment(tmp_path):
    env = {"NIBBLE_FETCH_TOKEN": " from-env\n"}
    assert read_token(None, "NIBBLE_FETCH_TOKEN", env) == "from-env"
    assert read_token(None, "NIBBLE_FETCH_TOKEN", {}) is None
    (tmp_path / "token").write_text("from-file\n")
    assert read_token(tmp_path / "token", "NIBBLE_FETCH_TOKEN", env) == "from-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token(tmp_path / "empty", "NIBBLE_FETCH_TOKEN", env)
    with pytest.raises(ValueError, match="missing"):
        read_token(tmp_path / "missing", "NIBBLE_FETCH_TOKEN", env)
