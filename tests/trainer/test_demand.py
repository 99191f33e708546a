"""The autoscaling signal ``nibble_sampler_demand``."""

from nibble.trainer.demand import sampler_demand


def test_an_idle_trainer_asks_for_more_samplers():
    assert sampler_demand(2, idle_seconds=1.0, step_seconds=2.0, queue_depth=0, groups_per_step=8, max_staleness=2) == 4
    assert (
        sampler_demand(2, idle_seconds=9.9, step_seconds=10.0, queue_depth=0, groups_per_step=8, max_staleness=2) == 8
    )


def test_a_backlog_beyond_the_staleness_window_asks_for_fewer():
    assert sampler_demand(4, 0.0, 1.0, queue_depth=48, groups_per_step=8, max_staleness=2) == 2
    assert sampler_demand(1, 0.0, 1.0, queue_depth=480, groups_per_step=8, max_staleness=0) == 1


def test_a_balanced_run_keeps_its_samplers():
    assert sampler_demand(3, 0.0, 1.0, queue_depth=8, groups_per_step=8, max_staleness=2) == 3
