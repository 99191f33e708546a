"""One simulated run (nibble.simulator.simulate): verdicts, determinism, knobs."""

import pytest

from nibble.simulator import SimConfig, drift_model, simulate
from tests.helpers import NO_RECIPE

SEEDS = range(20)


def test_synchronous_bf16_is_stable_and_is_its_own_baseline():
    summary = simulate(SimConfig(precision="bf16", max_staleness=0), ghosts=False).summary()
    assert summary["verdict"] == "stable"
    assert summary["speed_vs_sync_bf16"] == 1.0
    assert summary["mean_staleness"] == 0 and summary["discards"] == 0 and summary["grad_spikes"] == 0
    assert summary["precision_floor"] == 0.0103
    assert summary["critical_mismatch"] == pytest.approx(0.0441, abs=1e-4)


def test_nvfp4_without_recipe_at_staleness_8_long_horizon_diverges_for_most_seeds():
    """README "Simulator" states the count: 20 of 20 seeds at the defaults (8 samplers, batch 8, 200 steps)."""
    config = SimConfig(precision="nvfp4", **NO_RECIPE, max_staleness=8, horizon="long")
    verdicts = [simulate(config.with_(seed=s), ghosts=False).summary()["verdict"] for s in SEEDS]
    assert verdicts.count("diverged") == 20


def test_a_fixed_seed_is_deterministic_and_seeds_differ():
    config = SimConfig(max_staleness=3, horizon="long", precision="nvfp4", dequantized_backward=False)
    first, again = simulate(config), simulate(config)
    assert first.summary() == again.summary()
    assert first.run.dynamics == again.run.dynamics
    assert {p: g.dynamics for p, g in first.ghosts.items()} == {p: g.dynamics for p, g in again.ghosts.items()}
    other = simulate(config.with_(seed=1))
    assert other.summary()["wall_clock_seconds"] != first.summary()["wall_clock_seconds"]


def test_async_is_faster_than_synchronous_and_more_stale():
    sync = simulate(SimConfig(max_staleness=0), ghosts=False).summary()
    async_ = simulate(SimConfig(max_staleness=2), ghosts=False).summary()
    assert async_["speed_vs_sync_bf16"] > 1.3 * sync["speed_vs_sync_bf16"]
    assert async_["trainer_utilisation"] > sync["trainer_utilisation"]
    assert async_["mean_staleness"] > sync["mean_staleness"] == 0


def test_ghosts_are_the_other_precisions_with_the_same_knobs():
    result = simulate(SimConfig(precision="mxfp8"))
    assert set(result.ghosts) == {"bf16", "nvfp4"}
    assert result.ghosts["nvfp4"].config == SimConfig(precision="nvfp4")


def test_summary_reports_the_floor_critical_mismatch_and_headroom():
    summary = simulate(SimConfig(), ghosts=False).summary()
    assert summary["precision_floor"] == pytest.approx(0.0271)  # NVFP4 + 4/6, last 15% and shared BF16
    assert summary["drift_headroom"] == pytest.approx(drift_model.critical_mismatch() - summary["steady_mismatch"])
    assert summary["verdict"] in ("stable", "will_diverge", "diverged")


def test_a_run_above_critical_is_called_will_diverge_before_it_collapses():
    # Staleness 2 pins the batch mismatch at 0.0447, just above critical: the run has not collapsed after 30
    # steps (drift 1.94), but the drift map has no fixed point left (it collapses at step 42 of 200).
    summary = simulate(SimConfig(max_staleness=2, steps=30), ghosts=False).summary()
    assert summary["verdict"] == "will_diverge" and summary["collapsed_at_step"] is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("precision", "fp8", "precision='fp8' is not one of bf16, mxfp8, nvfp4 (--precision)"),
        ("max_staleness", 9, "max_staleness=9 is outside 0..8 (--max-staleness)"),
        ("max_staleness", -1, "max_staleness=-1 is outside 0..8"),
        ("batch", 12, "batch=12 is not one of 4, 8, 16 (--batch)"),
        ("horizon", "huge", "horizon='huge' is not one of short, medium, long (--horizon)"),
        ("num_samplers", 0, "num_samplers=0 is outside 1..64 (--num-samplers)"),
        ("steps", 0, "steps=0 is outside 1..5000 (--steps)"),
        ("seed", -3, "seed=-3 is outside 0..2^32-1 (--seed)"),
        ("four_over_six", 1, "four_over_six=1 must be a bool"),
        ("batch", True, "batch=True must be a int"),
    ],
)
def test_bad_knobs_raise_value_error_naming_the_knob(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("^", r"\^")):
        SimConfig(**{field: value})
