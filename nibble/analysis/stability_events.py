"""The stability evidence's event definitions, fixed before the grid ran (the stability issue; the
zero-norm rule below was added after 20-step pilots, before the grid).

- **Grad-norm spike**: a step whose global gradient norm (before clipping) exceeds ``SPIKE_FACTOR`` (5)
  times the median of the previous ``SPIKE_WINDOW`` (20) steps' finite norms. Steps with fewer than
  ``SPIKE_MIN_HISTORY`` (5) finite norms before them are not judged (a median of one or two steps is
  noise). A non-finite norm (a skipped optimiser step) counts as a spike whenever judged: it is the
  largest gradient there is. Non-finite norms never enter a median. A norm of exactly 0 is a step
  without learning signal (every group's rewards equal, so every advantage is 0 and nothing was
  updated): it is neither judged nor part of a median, as if the step had not happened (with small
  batches and low rewards such steps are common, and zeros in the window would make any later
  non-zero norm a "spike" of a zero median).
- **Collapse**: held-out accuracy falls below ``warm start − COLLAPSE_DROP`` (0.1) at an evaluation
  step ``t`` and no evaluation in ``(t, t + COLLAPSE_PATIENCE]`` (20 steps) is back at or above that
  threshold. A fall with fewer than ``COLLAPSE_PATIENCE`` steps of the run left after it is not judged
  (unresolved), so a run's last evaluations cannot count as collapses by default.

Pure Python (no torch, no numpy): the report command and the tests import it cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from statistics import median

SPIKE_FACTOR = 5.0
SPIKE_WINDOW = 20
SPIKE_MIN_HISTORY = 5
COLLAPSE_DROP = 0.1
COLLAPSE_PATIENCE = 20


def spike_steps(
    grad_norms: Sequence[float | None],
    *,
    factor: float = SPIKE_FACTOR,
    window: int = SPIKE_WINDOW,
    min_history: int = SPIKE_MIN_HISTORY,
) -> list[int]:
    """Indices (0-based positions in ``grad_norms``, one entry per trainer step) that are spikes.

    ``None`` and NaN/±inf entries are non-finite norms (skipped steps); ``0.0`` entries are steps without
    learning signal (ignored). Judged steps are the other steps with at least ``min_history`` finite
    non-zero norms among the previous ``window`` steps with a gradient (zero-norm steps do not count
    towards the window).

    Raises:
        ValueError: ``factor`` ≤ 0, ``window`` < 1 or ``min_history`` outside ``[1, window]``.
    """
    if not factor > 0 or window < 1 or not 1 <= min_history <= window:
        raise ValueError(f"spike_steps: factor={factor}, window={window}, min_history={min_history} out of range")
    spikes = []
    for i, norm, history in _judged(grad_norms, window, min_history):
        if norm is None or norm > factor * median(history):
            spikes.append(i)
    return spikes


def judged_steps(
    grad_norms: Sequence[float | None], *, window: int = SPIKE_WINDOW, min_history: int = SPIKE_MIN_HISTORY
) -> int:
    """How many steps :func:`spike_steps` judged (the denominator of "spikes per 100 steps")."""
    return sum(1 for _ in _judged(grad_norms, window, min_history))


def _judged(grad_norms: Sequence[float | None], window: int, min_history: int):
    """``(index, norm or None, finite history)`` of each judged step, zero-norm steps left out."""
    steps = [(i, _finite_or_none(v)) for i, v in enumerate(grad_norms) if v != 0]
    for k, (i, norm) in enumerate(steps):
        history = [v for _, v in steps[max(0, k - window) : k] if v is not None]
        if len(history) >= min_history:
            yield i, norm, history


def collapse_step(
    evaluations: Sequence[tuple[int, float]],
    warm_start: float,
    last_step: int,
    *,
    drop: float = COLLAPSE_DROP,
    patience: int = COLLAPSE_PATIENCE,
) -> int | None:
    """The first evaluation step at which the run collapsed, or ``None``.

    Args:
        evaluations: ``(step, held-out accuracy)`` pairs in increasing step order (accuracy in [0, 1]).
        warm_start: the held-out accuracy of the starting checkpoint (step 0).
        last_step: the run's last trainer step (a fall after ``last_step − patience`` is unresolved).

    Raises:
        ValueError: steps not strictly increasing.
    """
    steps = [s for s, _ in evaluations]
    if any(b <= a for a, b in pairwise(steps)):
        raise ValueError(f"collapse_step: evaluation steps must increase strictly, got {steps}")
    threshold = warm_start - drop
    for i, (step, value) in enumerate(evaluations):
        if value >= threshold or step + patience > last_step:
            continue
        window = [v for s, v in evaluations[i + 1 :] if s <= step + patience]
        if all(v < threshold for v in window):
            return step
    return None


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
