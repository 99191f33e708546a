"""The article's claims judged on a stability grid's runs (``nibble.analysis.stability_claims``)."""

import pytest

from nibble.analysis.stability_claims import NOT_REPRODUCED, NOT_RUN, NOT_SETTLED, REPRODUCED, Difference, claims


def run(variant: str, seed: int, *, reward: float, mismatch: float, spike_at: int | None = None) -> dict:
    steps = [
        {"step": i, "grad_norm": 40.0 if i == spike_at else 1.0, "reward": reward, "eval_accuracy": None,
         "logprob_abs_diff": mismatch, "fresh_logprob_abs_diff": None, "skipped_updates": 0}
        for i in range(1, 41)
    ]  # fmt: skip
    return {"variant": variant, "seed": seed, "warm_start_accuracy": 0.1, "steps": steps}


def grid(spec: dict[str, tuple[list[float], list[float], bool]]) -> dict:
    """``variant: (rewards per seed, mismatches per seed, spikes)``."""
    return {"runs": [
        run(v, seed, reward=r, mismatch=m, spike_at=20 if spikes else None)
        for v, (rewards, mismatches, spikes) in spec.items()
        for seed, (r, m) in enumerate(zip(rewards, mismatches, strict=True))
    ]}  # fmt: skip


def verdicts(results: dict) -> dict[str, str]:
    return {c.claim.split(":")[0]: c.verdict for c in claims(results)}


def test_the_articles_picture_is_reproduced_where_three_seeds_show_it():
    results = grid({
        "bf16": ([0.50, 0.52, 0.51], [0.010, 0.011, 0.012], False),
        "nvfp4_naive": ([0.30, 0.31, 0.29], [0.100, 0.105, 0.098], True),
        "nvfp4_token": ([0.40, 0.41, 0.39], [0.050, 0.052, 0.049], True),
        "nvfp4_4o6": ([0.30, 0.32, 0.28], [0.101, 0.099, 0.104], True),  # no better than naive
        "nvfp4_deq": ([0.45, 0.44, 0.46], [0.100, 0.102, 0.101], False),  # reward only
        "recipe": ([0.51, 0.49, 0.52], [0.020, 0.021, 0.019], False),
        "nvfp4_token_4o6": ([0.4] * 3, [0.05] * 3, True),
        "nvfp4_token_deq": ([0.4] * 3, [0.05] * 3, True),
        "nvfp4_4o6_deq": ([0.4] * 3, [0.05] * 3, True),
        "mxfp8": ([0.5] * 3, [0.020, 0.022, 0.021], False),
    })  # fmt: skip
    judged = claims(results)
    assert [c.verdict for c in judged] == [
        REPRODUCED,  # naive spikes, BF16 does not
        REPRODUCED,  # reward lower and mismatch higher, both beyond 2 standard errors
        REPRODUCED,  # per-token: both
        NOT_REPRODUCED,  # 4/6: neither difference shown with three seeds
        REPRODUCED,  # dequantised backward: the reward
        REPRODUCED,  # recipe within BF16's reward, no spike
        REPRODUCED,  # every pair spiked
        REPRODUCED,  # MXFP8 between
    ]
    assert "± " in judged[1].evidence and "3/3 seeds" in judged[1].evidence


def test_one_seed_settles_nothing_but_an_absent_spike_and_missing_variants_are_named():
    results = grid({
        "bf16": ([0.36], [0.024], False),
        "nvfp4_naive": ([0.23], [0.44], False),
        "recipe": ([0.24], [0.22], False),
    })  # fmt: skip
    judged = verdicts(results)
    assert judged["naive NVFP4 shows grad-norm spikes (more than BF16)"] == NOT_REPRODUCED  # none occurred
    assert judged["naive NVFP4 drifts from BF16"] == NOT_SETTLED
    assert (
        judged["the full recipe (all three, BF16 last 15% and shared experts) tracks BF16 without spikes"]
        == NOT_SETTLED
    )
    assert [c.evidence for c in claims(results) if c.verdict == NOT_RUN] == [
        "no run of nvfp4_token in this file", "no run of nvfp4_4o6 in this file", "no run of nvfp4_deq in this file",
        "no run of nvfp4_token_4o6, nvfp4_token_deq, nvfp4_4o6_deq in this file", "no run of mxfp8 in this file",
    ]  # fmt: skip


def test_a_recipe_that_spikes_or_falls_short_of_bf16_is_not_reproduced():
    base = {"bf16": ([0.50, 0.52, 0.51], [0.01] * 3, False), "nvfp4_naive": ([0.3] * 3, [0.1] * 3, False)}
    short = grid({**base, "recipe": ([0.40, 0.41, 0.39], [0.02] * 3, False)})
    spiky = grid({**base, "recipe": ([0.51, 0.50, 0.52], [0.02] * 3, True)})
    for results in (short, spiky):
        assert claims(results)[5].verdict == NOT_REPRODUCED


def test_a_difference_uses_welchs_standard_error_and_needs_two_seeds_of_each():
    d = Difference([1.0, 2.0, 3.0], [0.0, 0.0])
    assert d.delta == pytest.approx(2.0) and d.stderr == pytest.approx((1.0 / 3) ** 0.5)
    assert d.shown(+1) and not d.shown(-1) and d.settled_against(-1)
    one = Difference([1.0], [0.0, 0.1])
    assert one.stderr is None and one.shown(+1) is None and not one.settled_against(+1)
    assert one.text() == "1.000 vs 0.050 (1/2 seeds)"
