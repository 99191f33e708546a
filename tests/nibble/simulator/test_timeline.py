"""Invariants of the event-level timeline (nibble.simulator.timeline)."""

import itertools

import pytest

from nibble.simulator import SimConfig
from nibble.simulator.timeline import build_timeline

# Published NVFP4 + 4/6 rollout seconds, NVFP4 dequantized-backward train seconds, the default sync pause.
TIMES = (83.8, 70.41, 5.0)

CONFIGS = [
    SimConfig(),
    SimConfig(max_staleness=0),
    SimConfig(max_staleness=8, horizon="long", num_samplers=16),
    SimConfig(max_staleness=3, horizon="long", inflight_updates=True, seed=5),
    SimConfig(max_staleness=2, weight_sync=False, inflight_updates=True, batch=4, num_samplers=5, horizon="short"),
    SimConfig(max_staleness=4, batch=16, num_samplers=2, seed=9),
]


def ids(config):
    return f"s{config.max_staleness}-{config.horizon}-n{config.num_samplers}-inflight{int(config.inflight_updates)}"


@pytest.fixture(params=CONFIGS, ids=ids, scope="module")
def timeline(request):
    return request.param, build_timeline(request.param.with_(steps=80), *TIMES)


def test_runs_the_requested_steps_with_full_batches_in_time_order(timeline):
    config, tl = timeline
    assert [s.index for s in tl.steps] == list(range(80))
    for before, after in itertools.pairwise(tl.steps):
        assert before.end <= after.start
    assert all(len(s.rollouts) == config.batch for s in tl.steps)
    assert all(s.end - s.start == pytest.approx(TIMES[1]) for s in tl.steps)


def test_no_trajectory_is_consumed_before_it_was_produced(timeline):
    _, tl = timeline
    for step in tl.steps:
        for rid in step.rollouts:
            rollout = tl.rollouts[rid]
            assert rollout.end is not None and rollout.start < rollout.end <= step.start
            assert rollout.step == step.index and not rollout.discarded


def test_staleness_never_exceeds_the_cap_and_discards_are_over_cap(timeline):
    config, tl = timeline
    for r in tl.rollouts:
        if r.step is None:
            continue
        assert r.staleness == r.step - r.version
        assert (r.staleness > config.max_staleness) == r.discarded
    consumed = [tl.rollouts[rid].staleness for s in tl.steps for rid in s.rollouts]
    assert min(consumed) >= 0 and max(consumed) <= config.max_staleness


def test_admission_control_bounds_what_is_in_flight(timeline):
    """At every start: started − discarded so far ≤ (v + max_staleness + 1) · batch (AReaL's rule)."""
    config, tl = timeline
    for r in tl.rollouts:
        version = sum(s.end <= r.start for s in tl.steps)
        started = sum(o.start <= r.start for o in tl.rollouts)
        discarded = sum(o.discarded and tl.steps[o.step].start <= r.start for o in tl.rollouts if o.step is not None)
        assert started - discarded <= (version + config.max_staleness + 1) * config.batch


def test_a_sampler_runs_one_rollout_at_a_time_and_never_while_swapping(timeline):
    config, tl = timeline
    for i in range(config.num_samplers):
        mine = sorted((r for r in tl.rollouts if r.sampler == i and r.end is not None), key=lambda r: r.start)
        for a, b in itertools.pairwise(mine):
            assert a.end <= b.start
        if not config.inflight_updates:  # in-flight swaps pause a rollout in the middle, by design
            for p in (p for p in tl.pauses if p.sampler == i):
                assert not any(r.start < p.end and p.start < r.end for r in mine)


def test_rollout_time_is_generation_plus_pauses_and_segments_cover_it(timeline):
    config, tl = timeline
    for r in tl.rollouts:
        if r.end is None:
            continue
        versions = [v for v, _ in r.segments]
        assert versions == sorted(versions) and versions[0] == r.version
        assert sum(s for _, s in r.segments) == pytest.approx(r.generation_seconds, rel=1e-9)
        if config.inflight_updates:
            assert r.end - r.start >= r.generation_seconds - 1e-9
        else:
            assert len(r.segments) == 1 and r.end - r.start == pytest.approx(r.generation_seconds)


def test_synchronous_generates_exactly_one_batch_per_version_with_zero_staleness():
    tl = build_timeline(SimConfig(max_staleness=0, steps=30), *TIMES)
    assert len(tl.rollouts) == 30 * 8 and tl.discards == 0
    for step in tl.steps:
        assert {tl.rollouts[rid].version for rid in step.rollouts} == {step.index}


def test_weight_sync_pauses_cost_time_and_switch_off():
    on = build_timeline(SimConfig(max_staleness=0, steps=20), *TIMES)
    off = build_timeline(SimConfig(max_staleness=0, steps=20, weight_sync=False), *TIMES)
    assert on.pauses and not off.pauses
    assert all(p.end - p.start == pytest.approx(TIMES[2]) for p in on.pauses)
    assert on.end_time > off.end_time


def test_long_horizon_rollouts_are_heavy_tailed_and_capped_at_the_budget():
    tl = build_timeline(SimConfig(horizon="long", max_staleness=8, steps=200, num_samplers=16), *TIMES)
    seconds = sorted(r.generation_seconds for r in tl.rollouts)
    budget = TIMES[0] * 4.0
    assert seconds[-1] <= budget and seconds.count(budget) > 0  # some hit the length limit
    median = seconds[len(seconds) // 2]
    mean = sum(seconds) / len(seconds)
    assert mean > 1.5 * median  # heavy right tail
