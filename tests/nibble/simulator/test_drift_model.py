"""docs/design.md §7's formulas (nibble.simulator.drift_model) against hand-computed values."""

import itertools
import math

import pytest

from nibble.simulator import drift_model


def test_critical_mismatch_is_0_0441_with_the_published_constants():
    assert drift_model.critical_mismatch() == pytest.approx(0.0441, abs=1e-4)
    # m_eff,c = 0.12 / (2·√3.9) and m_c solves m² / (m + 0.02) = m_eff,c.
    assert drift_model.critical_effective_mismatch() == pytest.approx(0.030382, abs=1e-6)
    mc = drift_model.critical_mismatch()
    assert drift_model.effective_mismatch(mc) == pytest.approx(drift_model.critical_effective_mismatch(), rel=1e-12)


def test_the_drift_map_has_a_fixed_point_just_below_critical_and_none_just_above():
    mc = drift_model.critical_mismatch()
    assert drift_model.drift_fixed_points(drift_model.effective_mismatch(mc * 0.999)) is not None
    assert drift_model.drift_fixed_points(drift_model.effective_mismatch(mc * 1.001)) is None


# Hand-computed: f = 0.0103 + (f_format − 0.0103) · 1.6 · (0.625 if last 15%) · (0.8 if shared) (+ 0.008 NVFP4 no 4/6).
FLOORS = {
    # (last 15%, shared) in product order: neither, shared only, last 15% only, both
    "mxfp8": dict(zip(itertools.product((False, True), repeat=2), (0.0263, 0.0231, 0.0203, 0.0183), strict=True)),
    "nvfp4": dict(zip(itertools.product((False, True), repeat=2), (0.0543, 0.0471, 0.0408, 0.0363), strict=True)),
    "nvfp4_4o6": dict(zip(itertools.product((False, True), repeat=2), (0.0439, 0.03718, 0.0313, 0.0271), strict=True)),
}


@pytest.mark.parametrize(
    ("precision", "four_over_six", "last_15", "shared"),
    list(itertools.product(drift_model.PRECISIONS, (False, True), (False, True), (False, True))),
)
def test_precision_floor_of_every_knob_combination(precision, four_over_six, last_15, shared):
    floor = drift_model.precision_floor(
        precision, four_over_six=four_over_six, bf16_last_15=last_15, bf16_shared_experts=shared
    )
    if precision == "bf16":
        expected = 0.0103  # nothing quantised: the plan changes nothing
    else:
        key = "nvfp4_4o6" if precision == "nvfp4" and four_over_six else precision
        expected = FLOORS[key][last_15, shared]
    assert floor == pytest.approx(expected, abs=1e-12)


def test_staleness_cost_is_0_011_gap_to_the_1_5():
    assert [drift_model.staleness_cost(g) for g in (0, 1, 4)] == [0.0, 0.011, pytest.approx(0.088)]
    assert drift_model.staleness_cost(8) == pytest.approx(0.011 * 8 * math.sqrt(8))
    with pytest.raises(ValueError, match="gap=-1"):
        drift_model.staleness_cost(-1)


def test_drift_step_follows_the_map_and_never_goes_negative():
    # 1 + 6·0.01 + 0.65·0.01·1 − 0.12 = 0.9465, then + spike.
    assert drift_model.drift_step(1.0, 0.01, 0.3) == pytest.approx(0.9465 + 0.3)
    assert drift_model.drift_step(0.0, 0.0) == 0.0


def test_spike_law_only_nvfp4_spikes():
    law = drift_model.spike_law
    for precision in ("bf16", "mxfp8"):
        for fos, deq in itertools.product((False, True), repeat=2):
            assert law(precision, four_over_six=fos, dequantized_backward=deq) == drift_model.NO_SPIKES
    assert law("nvfp4", four_over_six=True, dequantized_backward=False) == drift_model.SpikeLaw(0.08, 0.4)
    assert law("nvfp4", four_over_six=False, dequantized_backward=False) == drift_model.SpikeLaw(0.08, 0.4)
    assert law("nvfp4", four_over_six=False, dequantized_backward=True) == drift_model.SpikeLaw(0.05, 0.3)
    assert law("nvfp4", four_over_six=True, dequantized_backward=True) == drift_model.NO_SPIKES


def test_reward_step_healthy_and_collapsed():
    # 0.45 + 0.06 · 0.43 · (1 − (0.022/0.22)²) · (1 − 0.12) = 0.45 + 0.0224730...
    assert drift_model.reward_step(0.45, 0.022, 1.0, False) == pytest.approx(0.45 + 0.06 * 0.43 * 0.99 * 0.88)
    assert drift_model.reward_step(0.45, 0.5, 10.0, False) == pytest.approx(0.45 + 0.06 * 0.43 * 0.15 * 0.5)
    assert drift_model.reward_step(0.5, 0.0, 0.0, True) == pytest.approx(0.39)
    assert drift_model.reward_step(0.09, 0.0, 0.0, True) == 0.08


def test_will_diverge_above_critical_above_the_unstable_point_or_with_a_high_stable_point():
    mc = drift_model.critical_mismatch()
    assert drift_model.will_diverge(0.0, mc * 1.01)
    assert not drift_model.will_diverge(0.0, 0.02)
    _, unstable = drift_model.drift_fixed_points(drift_model.effective_mismatch(0.02))
    assert drift_model.will_diverge(unstable + 0.01, 0.02)
    # Below critical but the stable fixed point already lies above the 2.2 collapse line.
    assert drift_model.will_diverge(0.0, mc * 0.99)


def test_drift_headroom_is_critical_minus_observed():
    assert drift_model.drift_headroom(0.03) == pytest.approx(drift_model.critical_mismatch() - 0.03)


def test_table_keys_and_a_bad_precision_is_named():
    assert drift_model.format_key("nvfp4", True) == "nvfp4_4o6" and drift_model.format_key("mxfp8", True) == "mxfp8"
    assert drift_model.train_key("bf16", True) == "bf16"
    assert drift_model.train_key("nvfp4", False) == "nvfp4_high_precision"
    assert drift_model.PUBLISHED_TRAIN_SECONDS["mxfp8_dequantized"] == pytest.approx(64.3 * 0.837)
    with pytest.raises(ValueError, match="precision='fp8'"):
        drift_model.precision_floor("fp8")


def test_no_mismatch_at_all_has_a_stable_fixed_point_and_a_negative_one_is_an_error():
    # A measured BF16 floor of 0, synchronous: m = m_eff = 0; the map is d ← 0.88·d + mean spike.
    assert drift_model.drift_fixed_points(0.0) == (0.0, math.inf)
    assert drift_model.drift_fixed_points(0.0, 0.06) == (pytest.approx(0.5), math.inf)
    assert not drift_model.will_diverge(0.0, 0.0) and not drift_model.will_diverge(5.0, 0.0)
    assert drift_model.will_diverge(0.0, 0.0, mean_spike=0.3)  # fixed point 2.5 > 2.2
    with pytest.raises(ValueError, match=r"m_eff=-0\.1 must be at least 0"):
        drift_model.drift_fixed_points(-0.1)


@pytest.mark.parametrize(
    ("key", "last_15", "shared"),
    list(itertools.product(("mxfp8", "nvfp4", "nvfp4_4o6"), (False, True), (False, True))),
)
def test_format_floor_from_measurement_inverts_the_whole_model(key, last_15, shared):
    floors = dict(drift_model.PUBLISHED_FLOORS, bf16=0.004)
    floors[key] = drift_model.format_floor_from_measurement(
        0.037, key=key, bf16_floor=0.004, bf16_last_15=last_15, bf16_shared_experts=shared
    )
    precision = "nvfp4" if key == "nvfp4_4o6" else key
    model = drift_model.precision_floor(
        precision, four_over_six=key == "nvfp4_4o6", bf16_last_15=last_15, bf16_shared_experts=shared, floors=floors
    )
    assert model == pytest.approx(0.037, abs=1e-15)
