"""The admission rule (AReaL's; docs/design.md §5), one pure function that the run config's validation,
the samplers' admission control (:class:`nibble.transport.stream.AdmissionCounter`) and the simulator's
timeline all call. The simulator's interactive page ports it to JavaScript (``simulator/web/model.js``).
"""

from __future__ import annotations


def allowed_groups(trainer_version: int, max_staleness: int, groups_per_version: int) -> int:
    """``(trainer_version + max_staleness + 1) × groups_per_version``: the most groups that may have been
    started while the trainer holds ``trainer_version``.

    Raises:
        ValueError: a negative version or staleness, or fewer than one group per version.
    """
    if trainer_version < 0 or max_staleness < 0:
        raise ValueError(f"trainer_version={trainer_version} and max_staleness={max_staleness} must be ≥ 0")
    if groups_per_version < 1:
        raise ValueError(f"groups_per_version={groups_per_version} must be ≥ 1")
    return (trainer_version + max_staleness + 1) * groups_per_version
