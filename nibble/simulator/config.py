"""The simulator's knobs, their ranges, and the workload shapes behind ``--horizon``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from nibble.simulator.drift_model import PRECISIONS

BATCHES = (4, 8, 16)
MAX_STALENESS = 8
MAX_SAMPLERS = 64
MAX_STEPS = 5000


@dataclass(frozen=True)
class Horizon:
    """Response-length law of a workload (illustrative, not measured).

    A response's generation time is ``rollout_seconds · length_scale · L``: ``rollout_seconds`` is the
    measured rollout time of one step at the article's 8k-token budget (a synchronous step waits for its
    longest response, which nearly reaches the budget), ``length_scale`` the budget relative to 8k tokens,
    and ``L = min(1, min_fraction · X)`` the response's share of the budget with ``X`` Pareto-distributed,
    ``P(X > x) = x^-tail``. Responses with ``L = 1`` hit the length limit (truncated; a share ``s^tail``).
    Mean of ``L`` (``s = min_fraction``): ``s(1 + ln(1/s))`` for tail 1, ``s(2 − s)`` for tail 2,
    ``s(4 − s³)/3`` for tail 4.
    """

    length_scale: float
    min_fraction: float
    tail: int


HORIZONS = {
    # 2k-token budget, light tail: mean L ≈ 0.40, 0.8% truncated.
    "short": Horizon(length_scale=0.25, min_fraction=0.3, tail=4),
    # the article's 8k-token budget: mean L ≈ 0.28, 2.3% truncated.
    "medium": Horizon(length_scale=1.0, min_fraction=0.15, tail=2),
    # 32k-token agentic budget, very heavy tail: mean L ≈ 0.13, 3% truncated.
    "long": Horizon(length_scale=4.0, min_fraction=0.03, tail=1),
}


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Defaults: Nibble's recipe (docs/design.md §3) with a little off-policy slack.

    Attributes:
        precision: rollout (and quantised-train) precision, ``bf16`` | ``mxfp8`` | ``nvfp4``.
        four_over_six: NVFP4 four-over-six adaptive block scaling (no effect on other precisions).
        dequantized_backward: backward on dequantised operands (the recipe) instead of high precision.
        bf16_last_15: last 15% of decoder layers kept in BF16.
        bf16_shared_experts: shared experts kept in BF16.
        max_staleness: trajectories more than this many versions behind the trainer are discarded
            (0 = synchronous: one batch generated per version); also sets admission control.
        weight_sync: model the weight-sync pause (a sampler stops generating while it swaps weights, for its
            format's ``Calibration.weight_sync_seconds``).
        inflight_updates: samplers swap weights in the middle of a rollout (PipelineRL-style), so one
            trajectory mixes versions; off = Nibble's rule, swap only between rollouts (docs/design.md §5).
        batch: trajectory groups per train step.
        horizon: response-length law, see :data:`HORIZONS`.
        num_samplers: samplers, each generating one trajectory group at a time.
        steps: train steps to simulate.
        seed: seed of the timeline and of the gradient spikes.
    """

    precision: str = "nvfp4"
    four_over_six: bool = True
    dequantized_backward: bool = True
    bf16_last_15: bool = True
    bf16_shared_experts: bool = True
    max_staleness: int = 1
    weight_sync: bool = True
    inflight_updates: bool = False
    batch: int = 8
    horizon: str = "medium"
    num_samplers: int = 8
    steps: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        _check_types(self)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not one of {', '.join(PRECISIONS)} (--precision)")
        if not 0 <= self.max_staleness <= MAX_STALENESS:
            raise ValueError(f"max_staleness={self.max_staleness} is outside 0..{MAX_STALENESS} (--max-staleness)")
        if self.batch not in BATCHES:
            raise ValueError(f"batch={self.batch} is not one of {', '.join(map(str, BATCHES))} (--batch)")
        if self.horizon not in HORIZONS:
            raise ValueError(f"horizon={self.horizon!r} is not one of {', '.join(HORIZONS)} (--horizon)")
        if not 1 <= self.num_samplers <= MAX_SAMPLERS:
            raise ValueError(f"num_samplers={self.num_samplers} is outside 1..{MAX_SAMPLERS} (--num-samplers)")
        if not 1 <= self.steps <= MAX_STEPS:
            raise ValueError(f"steps={self.steps} is outside 1..{MAX_STEPS} (--steps)")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed={self.seed} is outside 0..2^32-1 (--seed)")

    def with_(self, **changes) -> SimConfig:
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


def _check_types(config: SimConfig) -> None:
    for field in fields(config):
        value = getattr(config, field.name)
        expected = {"bool": bool, "int": int, "str": str}[field.type]
        # bool is a subclass of int: a True where a count belongs is a bug, not a 1.
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ValueError(f"{field.name}={value!r} must be a {field.type}")
