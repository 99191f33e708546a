"""``nibble.analysis.stability_report``: the mismatch-by-staleness table."""

from nibble.analysis.stability_report import staleness_table


def steps(pairs: list[tuple[float | None, float]]) -> list[dict]:
    out = []
    for i, (staleness, mismatch) in enumerate(pairs, start=1):
        step = {"step": i, "logprob_abs_diff": mismatch}
        if staleness is not None:
            step["staleness_mean"] = staleness
        out.append(step)
    return out


def test_steps_fall_into_half_open_buckets_seeds_pooled_and_unrecorded_steps_left_out():
    results = {"runs": [
        {"variant": "a", "seed": 0, "steps": steps([(0.0, 0.0), (0.5, 0.1), (1.0, 0.3), (1.5, 0.2)])},
        {"variant": "a", "seed": 1, "steps": steps([(0.0, 0.0), (2.0, 0.4), (3.0, 0.6), (None, 9.0)])},
        {"variant": "old", "seed": 0, "steps": steps([(None, 1.0)])},
    ]}  # fmt: skip
    lines = staleness_table(results).splitlines()
    assert lines[2] == "| variant | staleness 0 | staleness (0, 1] | staleness (1, 2] | staleness > 2 |"
    # (0, 1] holds 0.5 and 1.0; (1, 2] holds 1.5 and 2.0; > 2 holds 3.0; the unrecorded step is not counted
    assert lines[4] == "| a | 0.0000 (2) | 0.2000 (2) | 0.3000 (2) | 0.6000 (1) |"
    assert lines[5] == "| old | — | — | — | — |"
