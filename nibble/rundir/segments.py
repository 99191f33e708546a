"""A run folder's record of its segments (``run.json``): one entry per ``nibble run`` that worked on it.

A run stopped (Ctrl-C, a failed service, a lost machine) and resumed is one run in several segments.
Each segment records its wall-clock and what its samplers produced before the next segment's samplers
overwrite their counter files, so the summary's throughput covers the whole run, not the last segment.
A segment is written when it starts (status ``running``); one still ``running`` when the next starts
ended without its launcher (killed) and is closed from what it left behind.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECORD = "run.json"
STATUSES = ("running", "finished", "stopped", "failed", "killed")


@dataclass
class Segment:
    """One launch's share of a run: wall-clock seconds (after any warm start), the steps it began and ended
    at, and what its samplers produced (tokens, groups written)."""

    started_at: float
    first_step: int
    status: str = "running"
    ended_at: float | None = None
    last_step: int | None = None
    sampler_tokens: int = 0
    sampler_groups: int = 0
    warm_start_seconds: float = 0.0
    detail: str = ""

    @property
    def wall_seconds(self) -> float:
        return (self.ended_at or self.started_at) - self.started_at


@dataclass
class RunRecord:
    """``run.json``: the run's config as the user gave it (resumes must match it) and its segments."""

    config: dict | None = None
    segments: list[Segment] = field(default_factory=list)

    @classmethod
    def read(cls, out: Path) -> RunRecord:
        """The folder's record; an empty one when there is none.

        Raises:
            ValueError: ``run.json`` exists but is not a record this code wrote.
        """
        path = Path(out) / RECORD
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
            return cls(data["config"], [Segment(**s) for s in data["segments"]])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a run record ({exc}); move it away to treat the folder as new") from None

    def write(self, out: Path) -> None:
        """Replace ``run.json`` atomically (a crash leaves the old or the new record, never half of one)."""
        path = Path(out) / RECORD
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"config": self.config, "segments": [asdict(s) for s in self.segments]}, indent=2))
        tmp.replace(path)

    def begin(self, out: Path, first_step: int, warm_start_seconds: float = 0.0) -> Segment:
        """Close a segment whose launcher died, append a ``running`` one, and write the record."""
        if self.segments and self.segments[-1].status == "running":
            self.close(out, "killed", "its launcher ended without stopping the run")
        segment = Segment(time.time(), first_step, warm_start_seconds=warm_start_seconds)
        self.segments.append(segment)
        self.write(out)
        return segment

    def close(self, out: Path, status: str, detail: str = "") -> Segment:
        """End the last segment with ``status``: its steps and sampler counters from the folder; write."""
        if status not in STATUSES[1:]:
            raise ValueError(f"segment status {status!r}: expected one of {STATUSES[1:]}")
        segment = self.segments[-1]
        samplers = sampler_counters(out, since=segment.started_at)
        segment.status, segment.detail = status, detail
        segment.last_step = last_step(out)
        segment.sampler_tokens = sum(s.get("tokens", 0) for s in samplers)
        segment.sampler_groups = sum(s.get("groups_written", 0) for s in samplers)
        if status == "killed":  # no launcher saw the end: the last thing written is as close as we know
            segment.ended_at = max([segment.started_at, *(s.get("updated_at", 0) for s in samplers)])
        else:
            segment.ended_at = time.time()
        self.write(out)
        return segment


def sampler_counters(out: Path, since: float) -> list[dict]:
    """The counter files of samplers started at or after ``since`` (earlier files belong to an earlier
    segment whose sampler of the same name has not written yet)."""
    found = []
    for path in sorted((Path(out) / "samplers").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if record.get("started_at", 0) >= since:
            found.append(record)
    return found


def last_step(path: Path) -> int:
    """The last step in ``metrics.jsonl`` (0 when there is none)."""
    metrics = Path(path) / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    steps = [0]
    for line in metrics.read_text().splitlines():
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a killed trainer
    return max(steps)
