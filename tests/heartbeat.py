"""A pytest plugin: while one test (or its fixtures' set-up) runs long, a line now and then says which, for
how long, how long it took last time, and about how much of the session is left.

pytest prints nothing until a test ends, and a few of ours (the real-stack system tests, the session's
warm start) take minutes. Durations are kept in pytest's cache (``.pytest_cache``), so a fresh clone
shows elapsed time only. Lines go to the terminal itself (a copy of stdout taken before any test runs),
not through pytest's output capture.
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
    if config.getoption("heartbeat") > 0:
        config.pluginmanager.register(Heartbeat(config), "nibble-heartbeat")


class Heartbeat:
    """The plugin's state: the test under way, this session's durations and the last session's."""

    def __init__(self, config):
        self.every = config.getoption("heartbeat")
        self.cache = getattr(config, "cache", None)
        self.previous: dict[str, float] = self.cache.get(CACHE_KEY, {}) if self.cache is not None else {}
        self.durations: dict[str, float] = {}
        self.pending: list[str] = []
        self.current: tuple[str, float] | None = None
        self.terminal = os.dup(1)  # capture is suspended while plugins configure: this is the terminal
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="test-heartbeat", daemon=True)
        self.thread.start()

    def pytest_collection_finish(self, session):
        self.pending = [item.nodeid for item in session.items]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        started = time.monotonic()
        self.current = (item.nodeid, started)
        yield
        self.current = None
        self.durations[item.nodeid] = time.monotonic() - started
        if item.nodeid in self.pending:
            self.pending.remove(item.nodeid)

    def pytest_sessionfinish(self, session):
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(self.terminal)
        if self.cache is not None:
            self.cache.set(CACHE_KEY, {**self.previous, **self.durations})

    def _beat(self) -> None:
        beats = {}
        while not self.stop.wait(min(self.every / 4, 1.0)):
            current = self.current
            if current is None:
                continue
            nodeid, started = current
            elapsed = time.monotonic() - started
            if elapsed < self.every * (beats.get(current, 0) + 1):
                continue
            beats = {current: beats.get(current, 0) + 1}
            os.write(self.terminal, f"\n    ... {self.describe(nodeid, elapsed)}\n".encode())

    def describe(self, nodeid: str, elapsed: float) -> str:
        text = f"{nodeid} running for {_clock(elapsed)}"
        if nodeid in self.previous:
            text += f" (took {_clock(self.previous[nodeid])} last time)"
        others = [n for n in self.pending if n != nodeid]
        known = [self.previous[n] for n in others if n in self.previous]
        text += f"; {len(self.pending)} tests to go"
        if len(known) == len(others) and nodeid in self.previous:
            left = sum(known) + max(0.0, self.previous[nodeid] - elapsed)
            text += f", about {_clock(left)} left"
        elif known:  # a partial history (a fresh clone, or new tests) gives no honest ETA
            text += f" ({len(known)} of them took {_clock(sum(known))} last time)"
        return text


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs} s"
