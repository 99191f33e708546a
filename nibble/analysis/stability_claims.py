"""Verdicts on the article's stability claims from a stability grid's results, by a rule fixed in code.

The claims (*The 4-Bitter Lesson*, humans&, 2026, as issue 20 states them): naive NVFP4 spikes and drifts
from BF16; per-token activation scales, four-over-six and the dequantised backward each remove part of it;
BF16 last layers (and shared experts) with all three close the rest; with any two of the three, spikes
remain; MXFP8 lies between BF16 and NVFP4. Each is judged on the grid's variants by name
(``benchmarks/stability/variants.py``): ``bf16``, ``mxfp8``, ``nvfp4_naive``, ``nvfp4_token``,
``nvfp4_4o6``, ``nvfp4_deq``, the pairs ``nvfp4_token_4o6``, ``nvfp4_token_deq``, ``nvfp4_4o6_deq`` and
``recipe``.

The rule. Per run, the numbers of :func:`nibble.analysis.stability_report.summarize_run`: spikes per 100
judged steps (runs with no judged step left out), the last-10-steps batch reward, the mean |Δlogprob| over
all tokens. A difference of two variants' means over seeds is *shown* in a direction by Welch's t-test at
the two-sided 5% level: ``|Δ| > t · sqrt(s_a²/n_a + s_b²/n_b)``, ``s`` the sample standard deviation over
seeds and ``t`` Student's 97.5% quantile at the Welch–Satterthwaite degrees of freedom rounded down
(:data:`T_975`; 2.042 beyond 30). It needs two seeds of each; where every seed of both gives the same value
(no spread), a difference in the direction counts. Verdicts:

- *reproduced*: every difference the claim states is shown in its direction;
- *not reproduced*: with two seeds or more of each, one of them is not shown (or is shown the other way);
  for spikes also with one seed when none occurred in any judged step (the evidence gives how many steps);
- *not settled*: one seed of a variant it compares, so nothing can be shown; for the recipe also where
  the test is too weak to tell its gap to BF16 from naive's (below);
- *not testable*: the recipe's closing of the gap, where the naive variant shows no reward gap to BF16;
- *not run*: the file lacks a variant the claim needs.

The recipe claim is one of equivalence: it is *reproduced* when the naive variant's reward gap to BF16 is
shown and the recipe's is not (the test cannot prove equality; it finds no gap left), and the recipe
never spiked, and its reward is shown above naive's; *not settled* when the smallest gap the test on the
recipe would show (``t · stderr``) is no smaller than naive's gap, since a test that would miss a gap of
that size says nothing about whether it was closed, or when the recipe is shown neither below BF16 nor
above naive (added 2026-12-03, after two seeds of the recipe gave ``t · stderr`` = 0.22 against a gap of
0.13 at one degree of freedom: the first rule called that *reproduced*; both clauses only turn
*reproduced* into *not settled*). "Removes part" is *reproduced* when the variant's reward is shown above
naive's or its mismatch below, and neither is shown the other way. The pairs claim counts spikes:
*reproduced* when each of the three pairs spiked, *not reproduced* when a pair that ran never did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, stdev

from nibble.analysis.stability_report import RunSummary, runs_by_variant

# Student's t, 97.5% quantile, by degrees of freedom 1..30 (standard tables); beyond 30 the value at 30,
# which errs on the strict side.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
RULE = "Welch's t-test, two-sided 5%"

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_SETTLED = "not settled"
NOT_TESTABLE = "not testable"
NOT_RUN = "not run"

SINGLE_TECHNIQUES = {"nvfp4_token": "per-token activation scales", "nvfp4_4o6": "four-over-six",
                     "nvfp4_deq": "the dequantised backward"}  # fmt: skip
PAIRS = ("nvfp4_token_4o6", "nvfp4_token_deq", "nvfp4_4o6_deq")


@dataclass(frozen=True)
class Claim:
    """One claim, its verdict (:data:`REPRODUCED`, :data:`NOT_REPRODUCED`, :data:`NOT_SETTLED`,
    :data:`NOT_TESTABLE` or :data:`NOT_RUN`) and the numbers behind it."""

    claim: str
    verdict: str
    evidence: str


@dataclass(frozen=True)
class Difference:
    """``mean(a) − mean(b)`` of one metric over two variants' seeds, with Welch's standard error."""

    a: list[float]
    b: list[float]

    @property
    def delta(self) -> float:
        return fmean(self.a) - fmean(self.b)

    @property
    def stderr(self) -> float | None:
        """``sqrt(s_a²/n_a + s_b²/n_b)``; None with fewer than two seeds of either variant."""
        if len(self.a) < 2 or len(self.b) < 2:
            return None
        return math.sqrt(self._share(self.a) + self._share(self.b))

    @property
    def critical(self) -> float | None:
        """Student's 97.5% quantile at the Welch–Satterthwaite degrees of freedom (rounded down); None
        without two seeds of each or without any spread."""
        if self.stderr is None or self.stderr == 0:
            return None
        va, vb = self._share(self.a), self._share(self.b)
        dof = (va + vb) ** 2 / (va**2 / (len(self.a) - 1) + vb**2 / (len(self.b) - 1))
        return T_975[min(max(math.floor(dof), 1), len(T_975)) - 1]

    @staticmethod
    def _share(values: list[float]) -> float:
        return stdev(values) ** 2 / len(values)

    def shown(self, sign: int) -> bool | None:
        """Whether the difference is shown in direction ``sign`` (+1: a above b); None with one seed of
        either variant."""
        if self.stderr is None:
            return None
        return sign * self.delta > self.detectable()

    def detectable(self) -> float:
        """The ``|Δ|`` the test must exceed, ``t · stderr`` (0 where every seed of each gives one value: the
        difference is that of the values). Raises ValueError with one seed of either variant."""
        if self.stderr is None:
            raise ValueError("one seed: no difference can be shown")
        return 0.0 if self.stderr == 0 else self.critical * self.stderr

    def text(self, digits: int = 3) -> str:
        head = f"{fmean(self.a):.{digits}f} vs {fmean(self.b):.{digits}f}"
        seeds = f"{len(self.a)}/{len(self.b)} seeds"
        if self.stderr is None:
            return f"{head} ({seeds})"
        return f"{head} (Δ {self.delta:+.{digits}f} ± {self.stderr:.{digits}f}, {seeds})"


def claims(results: dict) -> list[Claim]:
    """Every claim's verdict for a validated stability results document (``load_results``)."""
    runs = runs_by_variant(results)
    return [
        _spikes(runs),
        _drift(runs),
        *(_removes_part(runs, variant, name) for variant, name in SINGLE_TECHNIQUES.items()),
        _recipe(runs),
        _pairs(runs),
        _mxfp8(runs),
    ]


def _diff(runs: dict[str, list[RunSummary]], a: str, b: str, metric: str) -> Difference:
    def values(variant: str) -> list[float]:
        judged = [r for r in runs[variant] if metric != "spikes_per_100" or r.judged_steps]
        return [getattr(r, metric) for r in judged]

    return Difference(values(a), values(b))


def _missing(runs, *variants: str) -> str | None:
    absent = [v for v in variants if v not in runs]
    return f"no run of {', '.join(absent)} in this file" if absent else None


def _verdict(parts: list[tuple[Difference, int]]) -> str:
    """REPRODUCED when every part is shown in its direction; NOT_SETTLED when one cannot be judged (one
    seed); else NOT_REPRODUCED."""
    shown = [d.shown(sign) for d, sign in parts]
    if None in shown:
        return NOT_SETTLED
    return REPRODUCED if all(shown) else NOT_REPRODUCED


def _spikes(runs) -> Claim:
    claim = "naive NVFP4 shows grad-norm spikes (more than BF16)"
    if why := _missing(runs, "nvfp4_naive", "bf16"):
        return Claim(claim, NOT_RUN, why)
    unjudged = [v for v in ("nvfp4_naive", "bf16") if not any(r.judged_steps for r in runs[v])]
    if unjudged:  # runs too short for the spike rule's running median
        return Claim(claim, NOT_SETTLED, f"no run of {', '.join(unjudged)} has a step the spike rule judges")
    spikes = _diff(runs, "nvfp4_naive", "bf16", "spikes_per_100")
    counts = sum(r.spikes for r in runs["nvfp4_naive"])
    steps = sum(r.judged_steps for r in runs["nvfp4_naive"])
    evidence = f"spikes per 100 steps {spikes.text(2)}; {counts} in {steps} judged naive steps"
    verdict = NOT_REPRODUCED if counts == 0 else _verdict([(spikes, +1)])
    return Claim(claim, verdict, evidence)


def _reward_and_mismatch(runs, better: str, worse: str) -> tuple[Difference, Difference, str]:
    """``better``'s last-10 reward minus ``worse``'s, ``worse``'s mean |Δlogprob| minus ``better``'s (both
    positive when ``better`` is), and the evidence text."""
    reward = _diff(runs, better, worse, "final_reward")
    mismatch = _diff(runs, worse, better, "logprob_abs_diff")
    return (
        reward,
        mismatch,
        (f"last-10 reward {better} vs {worse} {reward.text()}; mean |Δlogprob| {worse} vs {better} {mismatch.text(4)}"),
    )


def _drift(runs) -> Claim:
    claim = "naive NVFP4 drifts from BF16: lower reward, higher mismatch"
    if why := _missing(runs, "nvfp4_naive", "bf16"):
        return Claim(claim, NOT_RUN, why)
    reward, mismatch, evidence = _reward_and_mismatch(runs, "bf16", "nvfp4_naive")
    return Claim(claim, _verdict([(reward, +1), (mismatch, +1)]), evidence)


def _removes_part(runs, variant: str, technique: str) -> Claim:
    claim = f"adding {technique} ({variant}) to naive NVFP4 removes part of its drift: higher reward or lower mismatch"
    if why := _missing(runs, variant, "nvfp4_naive"):
        return Claim(claim, NOT_RUN, why)
    reward, mismatch, evidence = _reward_and_mismatch(runs, variant, "nvfp4_naive")
    if reward.stderr is None:
        verdict = NOT_SETTLED
    elif reward.shown(-1) or mismatch.shown(-1):
        verdict = NOT_REPRODUCED  # one of them is shown worse than naive's
    else:
        verdict = REPRODUCED if reward.shown(+1) or mismatch.shown(+1) else NOT_REPRODUCED
    return Claim(claim, verdict, evidence)


def _recipe(runs) -> Claim:
    claim = "the full recipe (all three, BF16 last 15% and shared experts) closes the gap: reward tracks BF16, no spike"
    if why := _missing(runs, "recipe", "bf16", "nvfp4_naive"):
        return Claim(claim, NOT_RUN, why)
    recipe = _diff(runs, "bf16", "recipe", "final_reward")
    naive = _diff(runs, "bf16", "nvfp4_naive", "final_reward")
    spikes = sum(r.spikes for r in runs["recipe"])
    evidence = (
        f"last-10 reward bf16 vs recipe {recipe.text()}; bf16 vs nvfp4_naive {naive.text()}; {spikes} recipe spikes"
    )
    if spikes:
        verdict = NOT_REPRODUCED
    elif recipe.stderr is None or naive.stderr is None:
        verdict = NOT_SETTLED
    elif recipe.shown(+1):
        verdict = NOT_REPRODUCED  # a reward gap to BF16 is left
    elif not naive.shown(+1):
        verdict = NOT_TESTABLE  # without a naive gap there is none to close
    elif (detectable := recipe.detectable()) >= naive.delta:
        verdict = NOT_SETTLED  # the test would have missed a gap as large as the one to close
        evidence += f"; the test shows only gaps above {detectable:.3f}, wider than the {naive.delta:.3f} to close"
    elif not (ahead := _diff(runs, "recipe", "nvfp4_naive", "final_reward")).shown(+1):
        verdict = NOT_SETTLED  # no gap shown to BF16, none to naive either: the runs tell neither apart
        evidence += f"; recipe vs nvfp4_naive {ahead.text()}, not shown above naive's"
    else:
        verdict = REPRODUCED
    return Claim(claim, verdict, evidence)


def _pairs(runs) -> Claim:
    claim = "with any two of the three techniques (no BF16 layers), spikes remain"
    present = [p for p in PAIRS if p in runs]
    if not present:
        return Claim(claim, NOT_RUN, f"no run of {', '.join(PAIRS)} in this file")
    counts = {p: sum(r.spikes for r in runs[p]) for p in present}
    evidence = "; ".join(f"{p}: {n} spike{'s' if n != 1 else ''} in {len(runs[p])} runs" for p, n in counts.items())
    missing = [p for p in PAIRS if p not in runs]
    if missing:
        evidence += f"; no run of {', '.join(missing)}"
    if not all(counts.values()):
        verdict = NOT_REPRODUCED  # a pair that ran never spiked
    else:
        verdict = NOT_SETTLED if missing else REPRODUCED
    return Claim(claim, verdict, evidence)


def _mxfp8(runs) -> Claim:
    claim = "MXFP8 lies between BF16 and naive NVFP4 in mismatch"
    if why := _missing(runs, "mxfp8", "bf16", "nvfp4_naive"):
        return Claim(claim, NOT_RUN, why)
    above_bf16 = _diff(runs, "mxfp8", "bf16", "logprob_abs_diff")
    below_naive = _diff(runs, "nvfp4_naive", "mxfp8", "logprob_abs_diff")
    evidence = f"mean |Δlogprob| mxfp8 vs bf16 {above_bf16.text(4)}; nvfp4_naive vs mxfp8 {below_naive.text(4)}"
    return Claim(claim, _verdict([(above_bf16, +1), (below_naive, +1)]), evidence)


def markdown(claims_: list[Claim]) -> str:
    """The verdicts as a GitHub-markdown table."""
    lines = [f"| claim | verdict ({RULE}) | evidence (mean over seeds; Δ ± standard error where two seeds or more) |",
             "|---|---|---|"]  # fmt: skip
    lines += [f"| {c.claim} | {c.verdict} | {c.evidence.replace('|', chr(92) + '|')} |" for c in claims_]
    return "\n".join(lines) + "\n"
