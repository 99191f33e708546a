"""How close to the critical mismatch a run can sit: collapse probability against drift headroom, on the
drift model of docs/design.md §7 (``nibble.simulator.drift_model``, the simulator's dynamics), for each spike law.

A run is held at a constant mismatch ``m = m_c − headroom`` (what ``nibble_drift_headroom`` reports) and
stepped through the drift map from zero drift, with the plan's gradient spikes, until it collapses
(drift > 2.2) or ``--steps`` pass; the fraction of ``--seeds`` seeds that collapsed is recorded. The
default alert margin (``nibble.monitoring.rules.HEADROOM_MARGIN``) is the smallest headroom on the grid
where no recipe plan short of the high-precision backward collapses in more than ``--tolerance`` of runs.

    .venv/bin/python -m benchmarks.headroom_margin   # → benchmarks/results/headroom_margin.json
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from benchmarks.machine import describe, write_record
from nibble.simulator import drift_model

PLANS = {  # the spike laws of docs/design.md §7, by the NVFP4 plans that have them
    "nvfp4 + 4/6, dequantized backward (the recipe)": drift_model.spike_law(
        "nvfp4", four_over_six=True, dequantized_backward=True
    ),
    "nvfp4 without 4/6": drift_model.spike_law("nvfp4", four_over_six=False, dequantized_backward=True),
    "nvfp4, high-precision backward": drift_model.spike_law("nvfp4", four_over_six=True, dequantized_backward=False),
}
GATING = ("nvfp4 + 4/6, dequantized backward (the recipe)", "nvfp4 without 4/6")
HEADROOMS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.012, 0.015, 0.02, 0.025, 0.03)


def collapse_fraction(headroom: float, law: drift_model.SpikeLaw, steps: int, seeds: int) -> float:
    """Fraction of seeds whose drift, held at ``m_c − headroom``, passes 2.2 within ``steps`` steps."""
    m_eff = drift_model.effective_mismatch(drift_model.critical_mismatch() - headroom)
    collapsed = 0
    for seed in range(seeds):
        rng, drift = random.Random(seed), 0.0
        for _ in range(steps):
            spike = law.kick if rng.random() < law.probability else 0.0
            drift = drift_model.drift_step(drift, m_eff, spike)
            if drift > drift_model.COLLAPSE_DRIFT:
                collapsed += 1
                break
    return collapsed / seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="train steps per run")
    parser.add_argument("--seeds", type=int, default=400)
    parser.add_argument("--tolerance", type=float, default=0.05, help="collapse fraction accepted")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/headroom_margin.json"))
    args = parser.parse_args()
    table = {
        plan: {str(h): collapse_fraction(h, law, args.steps, args.seeds) for h in HEADROOMS}
        for plan, law in PLANS.items()
    }
    safe = [h for h in HEADROOMS if all(table[plan][str(h)] <= args.tolerance for plan in GATING)]
    record = {
        "critical_mismatch": drift_model.critical_mismatch(),
        "steps": args.steps,
        "seeds": args.seeds,
        "tolerance": args.tolerance,
        "collapse_fraction": table,
        "margin": min(safe) if safe else None,
        "machine": describe(),
    }
    print(f"m_c = {record['critical_mismatch']:.4f} nats/token; collapse within {args.steps} steps:")
    print("headroom  " + "  ".join(f"{h:>6}" for h in HEADROOMS))
    for plan, row in table.items():
        print(f"{plan}\n          " + "  ".join(f"{row[str(h)]:6.3f}" for h in HEADROOMS))
    print(f"smallest headroom with ≤ {args.tolerance:.0%} collapses for {GATING}: {record['margin']}")
    write_record(args.out, record)


if __name__ == "__main__":
    main()
