"""The knob search and its frontier (nibble.simulator.optimize)."""

import pytest

from nibble.simulator import SimConfig, simulate
from nibble.simulator.optimize import frontier, markdown_table, precision_plans, search


@pytest.fixture(scope="module")
def candidates():
    return search(SimConfig(steps=40, horizon="long"), seeds=1, max_samplers=4)


def test_searches_every_distinct_plan_staleness_and_sampler_count(candidates):
    assert len(precision_plans()) == 25
    assert len(candidates) == 25 * 9 * 4
    assert {c.config.num_samplers for c in candidates} == {1, 2, 3, 4}
    assert {c.config.max_staleness for c in candidates} == set(range(9))


def test_frontier_is_stable_non_dominated_and_best_first(candidates):
    front = frontier(candidates)
    assert front and all(c.stable for c in front)
    speeds = [c.speed for c in front]
    assert speeds == sorted(speeds, reverse=True)
    for c in front:
        for other in candidates:
            if other.stable and other is not c:
                better = other.speed > c.speed + 0.01 and other.headroom > c.headroom + 1e-4
                assert not (better and other.config.num_samplers <= c.config.num_samplers)
    assert any(not c.stable for c in candidates)  # the search does reach unstable configurations


def test_candidate_numbers_match_a_direct_simulation(candidates):
    best = frontier(candidates)[0]
    summary = simulate(best.config, ghosts=False).summary()
    reference = simulate(SimConfig(steps=40, horizon="long", seed=best.config.seed), ghosts=False).summary()
    # speed is against synchronous BF16 with the base config's 8 samplers
    assert best.speed == pytest.approx(reference["sync_bf16_wall_clock_seconds"] / summary["wall_clock_seconds"])
    assert best.headroom == pytest.approx(summary["drift_headroom"])
    assert best.verdicts == ("stable",) and summary["verdict"] == "stable"


def test_markdown_table_has_a_row_per_frontier_entry(candidates):
    front = frontier(candidates)
    table = markdown_table(front, top=3)
    lines = table.strip().splitlines()
    assert lines[0].startswith("| # | precision |") and len(lines) == 2 + min(3, len(front))


def test_bad_search_arguments_are_named():
    with pytest.raises(ValueError, match="seeds=0"):
        search(SimConfig(steps=5), seeds=0)
    with pytest.raises(ValueError, match="max_samplers=0"):
        search(SimConfig(steps=5), max_samplers=0)
