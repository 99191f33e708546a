"""``--optimize``: search the knobs a user chooses and keep the throughput-vs-stability frontier.

Searched: every distinct precision plan (BF16; MXFP8 × backward × last-15 × shared experts; NVFP4 ×
four-over-six × backward × last-15 × shared experts: 25 plans), ``max_staleness`` 0..8 and
``num_samplers`` from :data:`SAMPLER_GRID` up to a budget. Held at the given values: the workload (batch,
horizon), weight sync, in-flight updates and the number of steps. Each candidate runs on ``seeds``
consecutive seeds; a candidate is *stable* when every seed ends ``stable``. The frontier holds the stable
candidates that no other stable candidate beats on all of speed, drift headroom and samplers used
(Pareto; see :func:`frontier` for ties), best first: fastest, then most headroom, then fewest samplers.

Timelines depend only on the step times, staleness, samplers and seed, so each is built once and shared
by the plans with the same step times.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from nibble.simulator import drift_model
from nibble.simulator.calibrate import Calibration, published
from nibble.simulator.config import MAX_STALENESS, SimConfig
from nibble.simulator.dynamics import step_costs
from nibble.simulator.simulate import run_config, step_seconds, sync_bf16
from nibble.simulator.timeline import Timeline, build_timeline

SAMPLER_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class Candidate:
    """One searched configuration, averaged over seeds (speed is against synchronous BF16 with the
    reference number of samplers; headroom = m_c − steady mismatch, nats/token)."""

    config: SimConfig
    speed: float
    headroom: float
    steady_mismatch: float
    mean_staleness: float
    utilisation: float
    discards_per_step: float
    verdicts: tuple[str, ...]

    @property
    def stable(self) -> bool:
        return all(v == "stable" for v in self.verdicts)

    def as_dict(self) -> dict:
        return {
            "config": self.config.as_dict(),
            "speed_vs_sync_bf16": self.speed,
            "drift_headroom": self.headroom,
            "steady_mismatch": self.steady_mismatch,
            "mean_staleness": self.mean_staleness,
            "trainer_utilisation": self.utilisation,
            "discards_per_step": self.discards_per_step,
            "verdicts": list(self.verdicts),
        }


def precision_plans() -> list[dict]:
    """The 25 distinct plans (knobs with no effect on a precision are left off)."""
    plans = [dict(precision="bf16", four_over_six=False, dequantized_backward=False, bf16_last_15=False,
                  bf16_shared_experts=False)]  # fmt: skip
    for precision in ("mxfp8", "nvfp4"):
        four_over_six = (False, True) if precision == "nvfp4" else (False,)
        for fos, deq, last, shared in itertools.product(four_over_six, (False, True), (False, True), (False, True)):
            plans.append(dict(precision=precision, four_over_six=fos, dequantized_backward=deq,
                              bf16_last_15=last, bf16_shared_experts=shared))  # fmt: skip
    return plans


def search(
    base: SimConfig, calibration: Calibration | None = None, *, seeds: int = 2, max_samplers: int = 16
) -> list[Candidate]:
    """Every candidate of the search space around ``base`` (see the module docstring)."""
    if not 1 <= seeds <= 20:
        raise ValueError(f"seeds={seeds} is outside 1..20 (--seeds)")
    if max_samplers < 1:
        raise ValueError(f"max_samplers={max_samplers} must be at least 1 (--max-samplers)")
    calibration = published() if calibration is None else calibration
    seed_list = [(base.seed + i) % 2**32 for i in range(seeds)]
    reference = {s: _timeline(sync_bf16(base.with_(seed=s)), calibration, {}).end_time for s in seed_list}
    cache: dict[tuple, Timeline] = {}
    costs: dict[int, list[float]] = {}
    samplers = [n for n in SAMPLER_GRID if n <= max_samplers]
    out = []
    for plan, staleness, n in itertools.product(precision_plans(), range(MAX_STALENESS + 1), samplers):
        config = base.with_(**plan, max_staleness=staleness, num_samplers=n)
        runs = []
        for seeded in _seeded(config, seed_list):
            timeline = _timeline(seeded, calibration, cache)
            if id(timeline) not in costs:
                costs[id(timeline)] = step_costs(timeline)
            runs.append(run_config(seeded, calibration, timeline, costs[id(timeline)]))
        out.append(_candidate(config, runs, reference))
    return out


def frontier(candidates: list[Candidate]) -> list[Candidate]:
    """Stable candidates not dominated on (speed ↑, headroom ↑, samplers ↓), best first.

    Speed is compared to 0.01 and headroom to 0.0001 nats/token (finer differences are seed noise); of
    candidates equal on all three, the one with the smallest ``max_staleness`` stays (the others ran
    the same timeline: staleness never reached their larger cap).
    """
    best: dict[tuple, Candidate] = {}
    for c in candidates:
        if c.stable:
            key = _objectives(c)
            if key not in best or c.config.max_staleness < best[key].config.max_staleness:
                best[key] = c
    kept = [c for key, c in best.items() if not any(_dominates(other, key) for other in best)]
    return sorted(kept, key=lambda c: (-c.speed, -c.headroom, c.config.num_samplers))


def _objectives(c: Candidate) -> tuple[float, float, int]:
    """What the frontier maximises: rounded speed, rounded headroom, minus samplers."""
    return round(c.speed, 2), round(c.headroom, 4), -c.config.num_samplers


def _dominates(a: tuple, b: tuple) -> bool:
    return a != b and all(x >= y for x, y in zip(a, b, strict=True))


def _seeded(config: SimConfig, seeds: list[int]) -> list[SimConfig]:
    return [config.with_(seed=s) for s in seeds]


def _timeline(config: SimConfig, calibration: Calibration, cache: dict) -> Timeline:
    """Built once per step times, staleness, samplers and seed. A timeline that never refused admission
    nor discarded anything is also the timeline of every larger ``max_staleness`` (same events)."""
    times = step_seconds(config, calibration)
    key = (*times, config.max_staleness, config.num_samplers, config.seed)
    if key not in cache:
        below = cache.get((*times, config.max_staleness - 1, config.num_samplers, config.seed))
        if below is not None and not below.admission_blocked and below.discards == 0:
            cache[key] = below
        else:
            cache[key] = build_timeline(config, *times)
    return cache[key]


def _candidate(config: SimConfig, runs: list, reference: dict[int, float]) -> Candidate:
    critical = drift_model.critical_mismatch()
    n = len(runs)
    return Candidate(
        config=config,
        speed=sum(reference[r.config.seed] / r.timeline.end_time for r in runs) / n,
        headroom=sum(critical - r.dynamics.steady_mismatch for r in runs) / n,
        steady_mismatch=sum(r.dynamics.steady_mismatch for r in runs) / n,
        mean_staleness=sum(r.mean_staleness for r in runs) / n,
        utilisation=sum(r.timeline.trainer_utilisation for r in runs) / n,
        discards_per_step=sum(r.timeline.discards / len(r.timeline.steps) for r in runs) / n,
        verdicts=tuple(r.dynamics.verdict for r in runs),
    )


FRONTIER_COLUMNS = (
    "#", "precision", "backward", "last 15% BF16", "shared BF16", "max staleness", "samplers",
    "speed × sync BF16", "headroom", "steady m", "mean staleness", "trainer util.",
)  # fmt: skip


def frontier_rows(front: list[Candidate]) -> list[tuple[str, ...]]:
    """Display cells of the frontier, one tuple per candidate in the order of :data:`FRONTIER_COLUMNS`."""
    rows = []
    for rank, c in enumerate(front, 1):
        k = c.config
        name = "nvfp4 + 4/6" if k.precision == "nvfp4" and k.four_over_six else k.precision
        quantised = k.precision != "bf16"
        backward = ("dequantized" if k.dequantized_backward else "high-precision") if quantised else "—"
        rows.append((
            str(rank), name, backward, _yes(k.bf16_last_15, quantised), _yes(k.bf16_shared_experts, quantised),
            str(k.max_staleness), str(k.num_samplers), f"{c.speed:.2f}", f"{c.headroom:.4f}",
            f"{c.steady_mismatch:.4f}", f"{c.mean_staleness:.2f}", f"{c.utilisation:.0%}",
        ))  # fmt: skip
    return rows


def _yes(flag: bool, applies: bool) -> str:
    return ("yes" if flag else "no") if applies else "—"


def markdown_table(front: list[Candidate], top: int | None = None) -> str:
    """The frontier as a Markdown table (the README's)."""
    rows = frontier_rows(front[:top] if top else front)
    lines = ["| " + " | ".join(FRONTIER_COLUMNS) + " |", "|" + "---|" * len(FRONTIER_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
