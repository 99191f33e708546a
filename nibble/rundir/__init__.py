"""A run folder's life across launches: which folder a run may write, and its record of segments."""

from nibble.rundir.folder import Found, State, choose, inspect, locked, next_free
from nibble.rundir.segments import RunRecord, Segment, last_step

__all__ = ["Found", "RunRecord", "Segment", "State", "choose", "inspect", "last_step", "locked", "next_free"]
