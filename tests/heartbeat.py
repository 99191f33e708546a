"""A pytest plugin: while a test (or its fixtures' set-up) runs long, a line now and then says which, for
how long, how long it took last time, and about how much of the session is left.

pytest prints nothing until a test ends, and a few of ours (the real-stack system tests, the session's
warm start) take minutes. Durations are kept in pytest's cache (``.pytest_cache``), so a fresh clone
shows elapsed time only. Lines go to the terminal itself (a copy of stdout taken before any test runs),
not through pytest's output capture.

It follows tests through the report hooks (``pytest_runtest_logstart`` / ``logfinish``), which pytest-xdist
calls in the controlling process for every test its workers run: under ``-n N`` the controller reports
each long test under way and the workers stay silent.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

CACHE_KEY = "nibble/durations"


def pytest_addoption(parser):
    parser.addoption(
        "--heartbeat",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="print a line every SECONDS while one test runs longer than that (0: never)",
    )


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    worker = hasattr(config, "workerinput")  # a pytest-xdist worker: its controller reports for it
    if config.getoption("heartbeat") > 0 and not worker:
        config.pluginmanager.register(Heartbeat(config), "nibble-heartbeat")


class Heartbeat:
    """The plugin's state: the tests under way, this session's durations and the last session's."""

    def __init__(self, config):
        self.every = config.getoption("heartbeat")
        self.workers: set[str] = set()  # pytest-xdist's workers that came up; none in a plain run
        self.cache = getattr(config, "cache", None)
        self.previous: dict[str, float] = self.cache.get(CACHE_KEY, {}) if self.cache is not None else {}
        self.durations: dict[str, float] = {}
        self.pending: list[str] = []
        self.running: dict[str, float] = {}  # nodeid -> start (time.monotonic())
        self.lock = threading.Lock()
        self.terminal = os.dup(1)  # capture is suspended while plugins configure: this is the terminal
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="test-heartbeat", daemon=True)
        self.thread.start()

    def pytest_collection_finish(self, session):
        self.pending = [item.nodeid for item in session.items]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodeready(self, node):
        with self.lock:
            self.workers.add(node.gateway.id)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        with self.lock:
            self.workers.discard(node.gateway.id)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        with self.lock:
            if not self.pending and not self.durations:  # every worker collects the same tests
                self.pending = list(ids)

    def pytest_runtest_logstart(self, nodeid, location):
        with self.lock:
            self.running[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid, location):
        self._finished(nodeid, record=True)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        self._finished(crashitem, record=False)  # a crashed worker's test never reaches logfinish

    def _finished(self, nodeid: str, record: bool) -> None:
        with self.lock:
            started = self.running.pop(nodeid, None)
            if started is not None and record:
                self.durations[nodeid] = time.monotonic() - started
            if nodeid in self.pending:
                self.pending.remove(nodeid)

    def pytest_sessionfinish(self, session):
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(self.terminal)
        if self.cache is not None:
            self.cache.set(CACHE_KEY, {**self.previous, **self.durations})

    def _beat(self) -> None:
        beats: dict[tuple[str, float], int] = {}
        while not self.stop.wait(min(self.every / 4, 1.0)):
            with self.lock:
                lines = []
                now = time.monotonic()
                for key in self.running.items():
                    if now - key[1] >= self.every * (beats.get(key, 0) + 1):
                        beats[key] = beats.get(key, 0) + 1
                        lines.append(self.describe(key[0], now))
                beats = {key: n for key, n in beats.items() if self.running.get(key[0]) == key[1]}
            for line in lines:
                os.write(self.terminal, f"\n    ... {line}\n".encode())

    def describe(self, nodeid: str, now: float) -> str:
        """One line on ``nodeid``, a test under way, at ``now`` (``time.monotonic()``); the caller holds the lock.

        The time left is the last session's durations of the tests not yet finished, less what those under
        way have run, shared among the workers, and at least what the longest test under way still needs; it is
        given only when every such test has a duration."""
        running = self.running
        text = f"{nodeid} running for {_clock(now - running[nodeid])}"
        if nodeid in self.previous:
            text += f" (took {_clock(self.previous[nodeid])} last time)"
        text += f"; {len(self.pending)} tests to go"
        known = [self.previous[n] for n in self.pending if n in self.previous]
        if len(known) == len(self.pending) and nodeid in self.previous:
            rest = [max(0.0, self.previous.get(n, 0.0) - (now - started)) for n, started in running.items()]
            ahead = sum(self.previous[n] for n in self.pending if n not in running) + sum(rest)
            text += f", about {_clock(max(ahead / max(1, len(self.workers)), *rest))} left"
        elif known:  # a partial history (a fresh clone, or new tests) gives no honest ETA
            text += f" ({len(known)} of them took {_clock(sum(known))} last time)"
        return text


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs} s"
