"""Progress of long CLI work, with an ETA: a rich bar on a terminal, a plain line now and then elsewhere.

Off a terminal (a pipe, a log file, CI) a live bar would print nothing until the end, so progress is a
line every ``every_seconds`` and one at the end, each with the count, the time taken and the time left.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as Bar

from nibble.analysis.run_report import duration


class Progress:
    """``with Progress("quantising", total=38, unit="tensors") as p: ... p.advance(note=name)``.

    ``per_unit`` scales the count shown (``unit="M elements", per_unit=1e6``). ``total`` may be an upper
    bound (a step budget that an early stop cuts short); ``eta()`` assumes the rate so far holds for the rest.
    """

    def __init__(
        self,
        description: str,
        total: int,
        *,
        unit: str = "",
        per_unit: float = 1,
        console: Console | None = None,
        every_seconds: float = 15.0,
    ):
        """``every_seconds``: off a terminal, a line at most this often and one at the end (``inf``: none, for
        callers that print their own lines with :meth:`eta`)."""
        self.description, self.total, self.unit, self.per_unit = description, max(1, total), unit, per_unit
        self.console = console or Console(stderr=True)
        self.every_seconds = every_seconds
        self.done = 0
        self.note = ""
        self._started = self._last_line = time.monotonic()
        self._said = 0  # units done at the last plain line
        self._first: tuple[int, float] | None = None  # (units done, when) at the first advance
        self._bar: Bar | None = None
        self._task = None

    def __enter__(self) -> Progress:
        self._started = self._last_line = time.monotonic()
        if self.console.is_terminal:
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[count]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"),
            )
            self._bar = Bar(*columns, console=self.console)
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total, note="", count=self.count())
        return self

    def __exit__(self, *exc_info) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif exc_info[0] is None and self._said != self.done and self.every_seconds != float("inf"):
            self._line()

    def set_total(self, total: int) -> None:
        """The amount of work, once known (after opening the inputs)."""
        self.total = max(1, total)
        if self._bar is not None:
            self._bar.update(self._task, total=self.total, count=self.count())

    def count(self) -> str:
        """``12/450 steps`` (or ``3.15/26.2 M elements`` with ``per_unit=1e6``)."""
        if self.per_unit == 1:
            return f"{self.done}/{self.total} {self.unit}".rstrip()
        return f"{self.done / self.per_unit:.3g}/{self.total / self.per_unit:.3g} {self.unit}".rstrip()

    def advance(self, n: int = 1, note: str = "") -> None:
        """``n`` more units done; ``note`` (e.g. the latest accuracy) is shown beside the count."""
        if self._first is None:
            self._first = (self.done + n, time.monotonic())
        self.done += n
        self.note = note or self.note
        if self._bar is not None:
            self._bar.update(self._task, advance=n, note=self.note, count=self.count())
        elif time.monotonic() - self._last_line >= self.every_seconds:
            self._line()

    def print(self, text: str) -> None:
        """A line of output above the bar (plain output off a terminal)."""
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def eta(self) -> str:
        """Time left at the rate since the first unit finished (the time before it — loading, start-up — is
        no guide to the rest); ``?`` until a later unit has."""
        if self._first is None or self.done <= self._first[0]:
            return "?"
        rate = (time.monotonic() - self._first[1]) / (self.done - self._first[0])
        return duration(rate * max(0, self.total - self.done))

    def _line(self) -> None:
        self._last_line, self._said = time.monotonic(), self.done
        elapsed = duration(self._last_line - self._started)
        note = f"  {self.note}" if self.note else ""
        share = f"{self.done / self.total:.0%}"
        self.print(f"{self.description}: {self.count()} ({share}), {elapsed}, ETA {self.eta()}{note}")
