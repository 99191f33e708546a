"""The stability evidence's fixed definitions on hand-made series: grad-norm spikes and collapses."""

import math

import pytest

from nibble.analysis.stability_events import collapse_step, judged_steps, spike_steps

FLAT = [1.0] * 30


def test_a_flat_series_has_no_spike_and_every_step_after_the_minimum_history_is_judged():
    assert spike_steps(FLAT) == []
    assert judged_steps(FLAT) == 25  # steps 5..29 have >= 5 finite norms before them


def test_a_step_above_five_times_the_running_median_is_a_spike_and_exactly_five_times_is_not():
    series = [*FLAT[:25], 5.0, 1.0, 5.01, 1.0]
    assert spike_steps(series) == [27]


def test_the_median_uses_only_the_previous_twenty_steps():
    # 25 steps at 1 then 15 at 4 (each 4x the median: not spikes). Before the last step the previous 20
    # hold 15 fours, median 4: 6 is not a spike. Over a 40-step window the median is still 1: it would be.
    series = [1.0] * 25 + [4.0] * 15 + [6.0]
    assert spike_steps(series) == []
    assert spike_steps(series, window=40) == [40]


def test_a_spike_enters_later_medians_like_any_other_step():
    series = [*FLAT[:20], 100.0, 6.0, 1.0]
    assert spike_steps(series) == [20, 21]  # median of the 20 before step 21 is still 1.0


def test_too_little_history_is_not_judged():
    assert spike_steps([1.0, 1.0, 1.0, 1.0, 100.0]) == []  # 4 previous norms < the minimum of 5
    assert spike_steps([1.0] * 5 + [100.0]) == [5]


def test_a_non_finite_norm_is_a_spike_and_never_enters_a_median():
    series = [*FLAT[:10], math.nan, None, math.inf, 1.0, 5.5]
    assert spike_steps(series) == [10, 11, 12, 14]
    assert judged_steps([None] * 10 + [1.0] * 3) == 0


def test_zero_norm_steps_have_no_signal_and_are_neither_judged_nor_in_a_median():
    series = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 6.0, 0.0, 1.0]
    assert spike_steps(series) == [9]  # the fifth non-zero norm before it; zeros never spike
    assert judged_steps(series) == 2
    # window counted in steps with a gradient: 20 ones, 30 zeros, then 6 is still judged against ones
    assert spike_steps([1.0] * 20 + [0.0] * 30 + [6.0]) == [50]


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="min_history"):
        spike_steps(FLAT, window=3, min_history=5)


def test_a_fall_that_never_recovers_within_twenty_steps_is_a_collapse_at_its_first_step():
    evals = [(10, 0.25), (20, 0.12), (30, 0.1), (40, 0.05), (50, 0.0)]
    assert collapse_step(evals, warm_start=0.25, last_step=50) == 20


def test_recovery_within_twenty_steps_is_not_a_collapse():
    evals = [(10, 0.12), (20, 0.1), (30, 0.15), (40, 0.3), (50, 0.3)]  # threshold 0.15: back at step 30
    assert collapse_step(evals, warm_start=0.25, last_step=50) is None


def test_recovery_after_more_than_twenty_steps_still_counts_the_collapse():
    evals = [(10, 0.1), (20, 0.1), (30, 0.1), (31, 0.4), (60, 0.4)]
    assert collapse_step(evals, warm_start=0.25, last_step=60) == 10


def test_the_threshold_itself_is_not_a_fall():
    assert collapse_step([(5, 0.15), (50, 0.15)], warm_start=0.25, last_step=50) is None
    assert collapse_step([(5, 0.1499), (50, 0.1)], warm_start=0.25, last_step=50) == 5


def test_a_fall_too_close_to_the_end_of_the_run_is_unresolved():
    evals = [(10, 0.3), (85, 0.0), (90, 0.0), (100, 0.0)]
    assert collapse_step(evals, warm_start=0.25, last_step=100) is None  # 85 + 20 > 100
    assert collapse_step(evals, warm_start=0.25, last_step=105) == 85


def test_evaluation_steps_must_increase():
    with pytest.raises(ValueError, match="increase"):
        collapse_step([(10, 0.1), (10, 0.2)], warm_start=0.25, last_step=50)
