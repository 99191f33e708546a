"""The throughput–stability model of docs/design.md §7, written once.

Source: the interactive "RL training simulator" of *The 4-Bitter Lesson: balancing stability and
performance in NVFP4 RL* (humans&, July 2026). Only the precision floors and step times are measurements
(Qwen3-30B-A3B, DAPO-math-17k, 8k tokens, last 15% of layers in BF16); the dynamics are illustrative.
The simulator (``nibble.simulator``) and the trainer's ``nibble_drift_headroom`` gauge both import this
module, and the simulator's interactive page ports these functions to JavaScript (``simulator/web/model.js``);
keep the three in step.

Units: a *mismatch* is a mean absolute train–rollout log-probability difference per token (nats, the
``logprob_abs_diff`` of docs/design.md §4); *drift* is dimensionless; seconds are wall-clock seconds per
train step. Pure Python (no numpy, no torch), so the command line starts fast; every formula uses only
``+ − × ÷`` and ``sqrt``, which IEEE 754 rounds identically in Python and JavaScript.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRECISIONS = ("bf16", "mxfp8", "nvfp4")
# Keys of the measured tables: a precision, with NVFP4 split by four-over-six.
FORMAT_KEYS = ("bf16", "mxfp8", "nvfp4", "nvfp4_4o6")

# Train–rollout |Δlogprob| floor per format (the article's table).
PUBLISHED_FLOORS = {"bf16": 0.0103, "mxfp8": 0.0203, "nvfp4_4o6": 0.0313, "nvfp4": 0.0328}
# Rollout seconds per step per format (the article's table).
PUBLISHED_ROLLOUT_SECONDS = {"bf16": 109.4, "mxfp8": 93.6, "nvfp4_4o6": 83.8, "nvfp4": 84.8}
# Train seconds per step: BF16 took 64.3 s; the others as a factor of it, by backward mode
# (high-precision / dequantized); NVFP4 with four-over-six trains "as NVFP4".
PUBLISHED_TRAIN_SECONDS_BF16 = 64.3
PUBLISHED_TRAIN_FACTORS = {
    ("mxfp8", "high_precision"): 0.768,
    ("mxfp8", "dequantized"): 0.837,
    ("nvfp4", "high_precision"): 1.022,
    ("nvfp4", "dequantized"): 1.095,
}
TRAIN_KEYS = ("bf16", "mxfp8_high_precision", "mxfp8_dequantized", "nvfp4_high_precision", "nvfp4_dequantized")
PUBLISHED_TRAIN_SECONDS = {"bf16": PUBLISHED_TRAIN_SECONDS_BF16} | {
    f"{precision}_{backward}": PUBLISHED_TRAIN_SECONDS_BF16 * factor
    for (precision, backward), factor in PUBLISHED_TRAIN_FACTORS.items()
}

# Precision floor: f = bf16 + (f_format − bf16) · 1.6 · (0.625 if last 15% BF16) · (0.8 if shared experts BF16),
# plus 0.008 for NVFP4 without four-over-six.
FLOOR_SCALE = 1.6
FLOOR_LAST_15_FACTOR = 0.625
FLOOR_SHARED_EXPERTS_FACTOR = 0.8
FLOOR_NO_FOUR_OVER_SIX_PENALTY = 0.008

# Staleness cost per trajectory: 0.011 · gap^1.5 (gap in policy versions).
STALENESS_COEFFICIENT = 0.011
# m = mean staleness cost + 0.5 · f; m_eff = m² / (m + 0.02).
FLOOR_WEIGHT = 0.5
EFFECTIVE_SOFTNESS = 0.02
# drift ← max(0, drift + 6·m_eff + 0.65·m_eff·drift² − 0.12·drift) + spike.
DRIFT_GAIN = 6.0
DRIFT_FEEDBACK = 0.65
DRIFT_DECAY = 0.12
COLLAPSE_DRIFT = 2.2
# reward: starts at 0.45, moves by 0.06 · (0.88 − r) · max(0.15, 1 − (m/0.22)²) · (1 − min(0.5, 0.12·drift));
# after collapse r ← max(0.08, 0.8·r − 0.01).
REWARD_START = 0.45
REWARD_RATE = 0.06
REWARD_CEILING = 0.88
REWARD_MISMATCH_SCALE = 0.22
REWARD_MIN_LEARNING = 0.15
REWARD_DRIFT_SLOWDOWN = 0.12
REWARD_MAX_SLOWDOWN = 0.5
REWARD_COLLAPSED_FLOOR = 0.08
REWARD_COLLAPSED_DECAY = 0.8
REWARD_COLLAPSED_STEP = 0.01


@dataclass(frozen=True)
class SpikeLaw:
    """Gradient spikes of one configuration: each train step adds ``kick`` to the drift with ``probability``."""

    probability: float
    kick: float

    @property
    def mean(self) -> float:
        """Expected drift added per step by spikes."""
        return self.probability * self.kick


NO_SPIKES = SpikeLaw(0.0, 0.0)


def check_precision(precision: str, *, field: str = "precision") -> None:
    """Raise ``ValueError`` naming ``field`` unless ``precision`` is bf16, mxfp8 or nvfp4."""
    if precision not in PRECISIONS:
        raise ValueError(f"{field}={precision!r} is not one of {', '.join(PRECISIONS)}")


def format_key(precision: str, four_over_six: bool) -> str:
    """Key of the measured tables: ``nvfp4_4o6`` for NVFP4 with four-over-six, else the precision.

    Four-over-six only exists for NVFP4; on the other precisions the flag changes nothing.
    """
    check_precision(precision)
    return "nvfp4_4o6" if precision == "nvfp4" and four_over_six else precision


def train_key(precision: str, dequantized_backward: bool) -> str:
    """Key of the train-time table: ``bf16``, or ``<precision>_high_precision`` / ``<precision>_dequantized``.

    BF16 has no quantised operands, so its backward mode changes nothing.
    """
    check_precision(precision)
    if precision == "bf16":
        return "bf16"
    return f"{precision}_{'dequantized' if dequantized_backward else 'high_precision'}"


def plan_floor_factor(bf16_last_15: bool, bf16_shared_experts: bool) -> float:
    """The multiplier of ``f_format − f_bf16`` in the precision floor: 1.6 · (0.625) · (0.8)."""
    factor = FLOOR_SCALE
    if bf16_last_15:
        factor = factor * FLOOR_LAST_15_FACTOR
    if bf16_shared_experts:
        factor = factor * FLOOR_SHARED_EXPERTS_FACTOR
    return factor


def precision_floor(
    precision: str,
    *,
    four_over_six: bool = False,
    bf16_last_15: bool = False,
    bf16_shared_experts: bool = False,
    floors: dict[str, float] | None = None,
) -> float:
    """Train–rollout mismatch floor ``f`` of a precision plan (nats per token; docs/design.md §7).

    ``f = f_bf16 + (f_format − f_bf16) · 1.6 · (0.625 if last 15% BF16) · (0.8 if shared experts BF16)``,
    plus 0.008 for NVFP4 without four-over-six. ``f_format`` is the NVFP4 + 4/6 floor when four-over-six
    is on, else the precision's floor. ``floors`` (keys of :data:`FORMAT_KEYS`) defaults to the published
    ones; BF16 has nothing quantised, so its floor is ``f_bf16`` whatever the plan.
    """
    floors = PUBLISHED_FLOORS if floors is None else floors
    base = floors["bf16"]
    if precision == "bf16":
        check_precision(precision)
        return base
    key = format_key(precision, four_over_six)
    floor = base + (floors[key] - base) * plan_floor_factor(bf16_last_15, bf16_shared_experts)
    if precision == "nvfp4" and not four_over_six:
        floor = floor + FLOOR_NO_FOUR_OVER_SIX_PENALTY
    return floor


def format_floor_from_measurement(
    measured: float,
    *,
    key: str,
    bf16_floor: float,
    bf16_last_15: bool,
    bf16_shared_experts: bool,
) -> float:
    """Invert :func:`precision_floor`: the table floor ``f_format`` of format ``key`` (one of
    :data:`FORMAT_KEYS` other than ``bf16``) that makes the model give exactly ``measured`` for the plan it
    was measured under.

    The whole model is inverted: for ``nvfp4`` (NVFP4 without four-over-six) the model adds 0.008 on top,
    so it is taken off first; then the plan factor is divided out. The result can fall below
    ``bf16_floor`` (a measurement below the BF16 floor, or below 0.008 for NVFP4 without 4/6); the model
    cannot reproduce such a measurement, and ``nibble.simulator.calibrate`` clamps it (its docstring).
    """
    if key not in FORMAT_KEYS or key == "bf16":
        raise ValueError(f"key={key!r} is not one of {', '.join(FORMAT_KEYS[1:])}")
    if key == "nvfp4":
        measured = measured - FLOOR_NO_FOUR_OVER_SIX_PENALTY
    return bf16_floor + (measured - bf16_floor) / plan_floor_factor(bf16_last_15, bf16_shared_experts)


def staleness_cost(gap: float) -> float:
    """Mismatch contributed by a trajectory ``gap`` policy versions old: ``0.011 · gap^1.5`` (nats/token)."""
    if gap < 0:
        raise ValueError(f"gap={gap} is negative; staleness counts versions behind the trainer")
    return STALENESS_COEFFICIENT * (gap * math.sqrt(gap))


def batch_mismatch(mean_staleness_cost: float, floor: float) -> float:
    """``m = mean staleness cost + 0.5 · f``: the model's per-batch mismatch (nats per token)."""
    return mean_staleness_cost + FLOOR_WEIGHT * floor


def effective_mismatch(m: float) -> float:
    """``m_eff = m² / (m + 0.02)``: small mismatches are damped, large ones pass almost unchanged."""
    return (m * m) / (m + EFFECTIVE_SOFTNESS)


def drift_step(drift: float, m_eff: float, spike: float = 0.0) -> float:
    """One train step of the drift map: ``max(0, d + 6·m_eff + 0.65·m_eff·d² − 0.12·d) + spike``."""
    moved = drift + DRIFT_GAIN * m_eff + DRIFT_FEEDBACK * m_eff * (drift * drift) - DRIFT_DECAY * drift
    return max(0.0, moved) + spike


def critical_effective_mismatch() -> float:
    """``m_eff,c = 0.12 / (2 · √(0.65 · 6))``: above it the drift map has no fixed point (≈ 0.0304)."""
    return DRIFT_DECAY / (2.0 * math.sqrt(DRIFT_FEEDBACK * DRIFT_GAIN))


def critical_mismatch() -> float:
    """Critical mismatch ``m_c``, where ``m_eff(m_c) = m_eff,c`` (≈ 0.0441 nats/token).

    ``m_c = (m_eff,c + √(m_eff,c² + 4 · 0.02 · m_eff,c)) / 2``, the positive root of
    ``m² − m_eff,c · m − 0.02 · m_eff,c = 0``.
    """
    mc = critical_effective_mismatch()
    return (mc + math.sqrt(mc * mc + 4.0 * EFFECTIVE_SOFTNESS * mc)) / 2.0


def drift_headroom(observed_mismatch: float) -> float:
    """``nibble_drift_headroom = m_c − m_obs``; ``m_obs`` is the last batch's mean |π_old − μ| (nats/token)."""
    return critical_mismatch() - observed_mismatch


def spike_law(precision: str, *, four_over_six: bool, dequantized_backward: bool) -> SpikeLaw:
    """Gradient spikes: only NVFP4 spikes — probability 0.08 and kick 0.4 with the high-precision backward,
    else 0.05 and 0.3 when four-over-six is off, else never."""
    check_precision(precision)
    if precision != "nvfp4":
        return NO_SPIKES
    if not dequantized_backward:
        return SpikeLaw(0.08, 0.4)
    if not four_over_six:
        return SpikeLaw(0.05, 0.3)
    return NO_SPIKES


def reward_step(reward: float, m: float, drift: float, collapsed: bool) -> float:
    """Reward after one train step (illustrative).

    Healthy: ``r + 0.06 · (0.88 − r) · max(0.15, 1 − (m/0.22)²) · (1 − min(0.5, 0.12 · drift))``;
    collapsed: ``max(0.08, 0.8 · r − 0.01)``.
    """
    if collapsed:
        return max(REWARD_COLLAPSED_FLOOR, REWARD_COLLAPSED_DECAY * reward - REWARD_COLLAPSED_STEP)
    ratio = m / REWARD_MISMATCH_SCALE
    learning = max(REWARD_MIN_LEARNING, 1.0 - ratio * ratio)
    slowdown = 1.0 - min(REWARD_MAX_SLOWDOWN, REWARD_DRIFT_SLOWDOWN * drift)
    return reward + REWARD_RATE * (REWARD_CEILING - reward) * learning * slowdown


def drift_fixed_points(m_eff: float, mean_spike: float = 0.0) -> tuple[float, float] | None:
    """Fixed points ``(stable, unstable)`` of the drift map with spikes replaced by their mean, or ``None``.

    Solves ``0.65·m_eff·d² − 0.12·d + (6·m_eff + mean_spike) = 0``; no real root means the drift grows
    without bound whatever its start. ``m_eff = 0`` (a batch with no mismatch at all: a measured BF16 floor
    of 0, no staleness) leaves the linear map ``d ← 0.88·d + mean_spike``, whose one fixed point
    ``mean_spike / 0.12`` is stable (the unstable one is at infinity). Negative ``m_eff`` is an error.
    """
    if not m_eff >= 0:
        raise ValueError(f"m_eff={m_eff} must be at least 0 (floors and staleness costs are not negative)")
    c = DRIFT_GAIN * m_eff + mean_spike
    if m_eff == 0:
        return c / DRIFT_DECAY, math.inf
    a = DRIFT_FEEDBACK * m_eff
    disc = DRIFT_DECAY * DRIFT_DECAY - 4.0 * a * c
    if disc < 0:
        return None
    root = math.sqrt(disc)
    return (DRIFT_DECAY - root) / (2.0 * a), (DRIFT_DECAY + root) / (2.0 * a)


def will_diverge(drift: float, m: float, mean_spike: float = 0.0) -> bool:
    """Whether the drift map, held at mismatch ``m`` with mean spikes, carries ``drift`` past 2.2.

    True when the map has no fixed point (``m`` above critical, or spikes push it over), when ``drift`` is
    already above the unstable fixed point, or when the stable fixed point itself lies above 2.2.
    """
    points = drift_fixed_points(effective_mismatch(m), mean_spike)
    if points is None:
        return True
    stable, unstable = points
    return drift > unstable or stable > COLLAPSE_DRIFT
