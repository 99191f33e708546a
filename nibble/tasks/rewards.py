"""Custom reward functions, run in a worker process with a per-call timeout.

A reward function named ``"package.module:function"`` with signature
``(prompt: str, response: str, answer: str) -> float`` runs in a child process
(``nibble.tasks.reward_worker``) that speaks JSON lines over pipes. A call that hangs past its timeout
gets the worker killed (threads cannot be) and a fresh one started for the next call; the caller is never
blocked longer than the timeout per call, and never sees an exception from the function.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence

logger = logging.getLogger(__name__)

FAILURE_REASONS = ("exception", "timeout", "non_finite", "not_a_number", "worker_died")
STARTUP_TIMEOUT_S = 60.0  # interpreter start plus the function's imports


class _Worker:
    """One child process and a line reader over its reply pipe, with deadlines."""

    def __init__(self, path: str, startup_timeout: float):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nibble.tasks.reward_worker", path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: a kill also reaches processes the function started
        )
        self._finalizer = weakref.finalize(self, _kill, self.process)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        self._buffer = b""
        self.exited = False  # its reply pipe reached end of file
        reply = self.read_line(startup_timeout)
        if reply is None or "error" in reply or not reply.get("ready"):
            self.stop(grace=0)
            why = "it did not start in time or exited" if reply is None else reply.get("error", reply)
            raise ValueError(f"reward path {path!r}: worker failed to load the function: {why}")

    def send(self, item: dict) -> bool:
        """Write one request; ``False`` when the worker is gone."""
        try:
            self.process.stdin.write((json.dumps(item) + "\n").encode())
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def read_line(self, timeout: float) -> dict | None:
        """The next reply, or ``None`` when ``timeout`` seconds pass or the worker exits first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                self.exited = True
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def alive(self) -> bool:
        return not self.exited and self.process.poll() is None

    def stop(self, grace: float = 1.0) -> None:
        """Close its input (it exits at end of input), then kill it if it has not exited after ``grace`` s."""
        self._selector.close()
        try:
            self.process.stdin.close()
            self.process.wait(grace)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._finalizer()


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group outlives its leader while children remain
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None and not pipe.closed:
            pipe.close()


class RewardRunner:
    """Scores responses with the function at ``path`` in a worker process, ``timeout`` seconds per call.

    ``score``/``score_many`` return the reward (a finite float) or ``None`` when the call raised, timed
    out, returned something that is not a real number or is not finite, or the worker died; ``counts``
    holds how many calls failed for each of those reasons. Calls are serialised (thread-safe). Use as a
    context manager, or call ``close()``, to stop the worker.

    Raises:
        ValueError: at construction, naming ``path``, when it is not ``"package.module:function"`` or the
            function cannot be imported (the import runs in the worker, so a module that hangs on import
            fails after ``startup_timeout`` instead of hanging the caller); naming ``timeout`` when it is
            not positive.
    """

    def __init__(self, path: str, *, timeout: float = 5.0, startup_timeout: float = STARTUP_TIMEOUT_S):
        if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
            raise ValueError(f"reward path {path!r} must look like 'package.module:function'")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")
        self.path = path
        self.timeout = float(timeout)
        self.startup_timeout = startup_timeout
        self.counts: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self._lock = threading.Lock()
        self._worker: _Worker | None = _Worker(path, startup_timeout)
        self._closed = False

    @property
    def pid(self) -> int | None:
        """Process id of the current worker, ``None`` between a failure and the next call (or after close)."""
        return self._worker.process.pid if self._worker is not None else None

    def score(self, prompt: str, response: str, answer: str) -> float | None:
        """One reward, or ``None`` on failure (counted)."""
        return self.score_many([(prompt, response, answer)])[0]

    def score_many(self, items: Iterable[Sequence[str]]) -> list[float | None]:
        """Rewards of ``(prompt, response, answer)`` triples, in order; each call has its own timeout."""
        with self._lock:
            if self._closed:
                raise ValueError(f"RewardRunner({self.path!r}) is closed")
            return [self._score_one(prompt, response, answer) for prompt, response, answer in items]

    def _score_one(self, prompt: str, response: str, answer: str) -> float | None:
        worker = self._ensure_worker()
        if worker is None:
            return self._fail("worker_died", "could not restart the worker")
        if not worker.send({"prompt": prompt, "response": response, "answer": answer}):
            return self._restart_after("worker_died", "the worker's input pipe is closed")
        reply = worker.read_line(self.timeout)
        if reply is None and worker.exited:
            return self._restart_after("worker_died", "the worker exited while scoring")
        if reply is None:
            return self._restart_after("timeout", f"no reply within {self.timeout} s")
        if "reward" in reply and isinstance(reply["reward"], float) and math.isfinite(reply["reward"]):
            return reply["reward"]
        reason = reply.get("fail") if reply.get("fail") in FAILURE_REASONS else "not_a_number"
        return self._fail(reason, reply.get("detail", repr(reply)))

    def _ensure_worker(self) -> _Worker | None:
        if self._worker is None or not self._worker.alive():
            if self._worker is not None:
                self._worker.stop(grace=0)
            try:
                self._worker = _Worker(self.path, self.startup_timeout)
            except ValueError as exc:
                logger.warning("reward %s: %s", self.path, exc)
                self._worker = None
        return self._worker

    def _restart_after(self, reason: str, detail: str) -> None:
        if self._worker is not None:
            self._worker.stop(grace=0)
            self._worker = None
        return self._fail(reason, detail)

    def _fail(self, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        log = logger.warning if self.counts[reason] == 1 else logger.debug
        log("reward %s failed (%s): %s", self.path, reason, detail)
        return None

    def close(self) -> None:
        """Stop the worker process; later calls raise ``ValueError``. Safe to call twice."""
        with self._lock:
            self._closed = True
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
