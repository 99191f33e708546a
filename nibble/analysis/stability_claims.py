"""Verdicts on the article's stability claims from a stability grid's results, by a rule fixed in code.

The claims (*The 4-Bitter Lesson*, humans&, 2026, as issue 20 states them): naive NVFP4 spikes and drifts
from BF16; per-token activation scales, four-over-six and the dequantised backward each remove part of it;
BF16 last layers (and shared experts) with all three close the rest; with any two of the three, spikes
remain; MXFP8 lies between BF16 and NVFP4. Each is judged on the grid's variants by name
(``benchmarks/stability/variants.py``): ``bf16``, ``mxfp8``, ``nvfp4_naive``, ``nvfp4_token``,
``nvfp4_4o6``, ``nvfp4_deq``, the pairs ``nvfp4_token_4o6``, ``nvfp4_token_deq``, ``nvfp4_4o6_deq`` and
``recipe``.

The rule: per run, the numbers of :func:`nibble.analysis.stability_report.summarize_run` (spikes per 100
judged steps, the last-10-steps batch reward, the mean |Δlogprob| over all tokens); per variant, their mean
over seeds. A difference between two variants is *shown* when the means differ by more than
:data:`SIGNIFICANCE` standard errors of the difference, ``sqrt(s_a²/n_a + s_b²/n_b)`` with ``s`` the sample
standard deviation over seeds (Welch's), so it needs two seeds of each; with fewer the verdict says what
one seed shows and that it is not settled. A claim is *reproduced* when every difference it states is
shown in its direction, *not reproduced* when one is settled against it (or, for spikes, none occurred),
*not run* when the file lacks a variant it needs, and *not settled* otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, stdev

from nibble.analysis.stability_report import RunSummary, runs_by_variant

SIGNIFICANCE = 2.0  # standard errors of a difference of means

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_SETTLED = "not settled"
NOT_RUN = "not run"

SINGLE_TECHNIQUES = {"nvfp4_token": "per-token activation scales", "nvfp4_4o6": "four-over-six",
                     "nvfp4_deq": "the dequantised backward"}  # fmt: skip
PAIRS = ("nvfp4_token_4o6", "nvfp4_token_deq", "nvfp4_4o6_deq")


@dataclass(frozen=True)
class Claim:
    """One claim, its verdict (:data:`REPRODUCED`, :data:`NOT_REPRODUCED`, :data:`NOT_SETTLED` or
    :data:`NOT_RUN`) and the numbers behind it."""

    claim: str
    verdict: str
    evidence: str


@dataclass(frozen=True)
class Difference:
    """``mean(a) − mean(b)`` of one metric over two variants' seeds, with its standard error."""

    a: list[float]
    b: list[float]

    @property
    def delta(self) -> float:
        return fmean(self.a) - fmean(self.b)

    @property
    def stderr(self) -> float | None:
        """Welch's standard error; None with fewer than two seeds of either variant."""
        if len(self.a) < 2 or len(self.b) < 2:
            return None
        return math.sqrt(stdev(self.a) ** 2 / len(self.a) + stdev(self.b) ** 2 / len(self.b))

    def shown(self, sign: int) -> bool | None:
        """Whether the difference is shown in direction ``sign`` (+1: a above b); None when it cannot be
        judged (one seed of either)."""
        if self.stderr is None:
            return None
        return sign * self.delta > SIGNIFICANCE * self.stderr

    def settled_against(self, sign: int) -> bool:
        """Shown in the opposite direction, or, with a spread, no difference in the claimed one."""
        return self.stderr is not None and not self.shown(sign)

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


def _values(runs: dict[str, list[RunSummary]], variant: str, metric: str) -> list[float]:
    return [getattr(r, metric) for r in runs[variant]]


def _diff(runs, a: str, b: str, metric: str) -> Difference:
    return Difference(_values(runs, a, metric), _values(runs, b, metric))


def _missing(runs, *variants: str) -> str | None:
    absent = [v for v in variants if v not in runs]
    return f"no run of {', '.join(absent)} in this file" if absent else None


def _verdict(parts: list[tuple[Difference, int]]) -> str:
    """REPRODUCED when every part is shown in its direction, NOT_REPRODUCED when one is settled against."""
    if any(d.settled_against(sign) for d, sign in parts):
        return NOT_REPRODUCED
    if all(d.shown(sign) for d, sign in parts):
        return REPRODUCED
    return NOT_SETTLED


def _spikes(runs) -> Claim:
    claim = "naive NVFP4 shows grad-norm spikes (more than BF16)"
    if why := _missing(runs, "nvfp4_naive", "bf16"):
        return Claim(claim, NOT_RUN, why)
    spikes = _diff(runs, "nvfp4_naive", "bf16", "spikes_per_100")
    counts = sum(r.spikes for r in runs["nvfp4_naive"])
    steps = sum(r.judged_steps for r in runs["nvfp4_naive"])
    evidence = f"spikes per 100 steps {spikes.text(2)}; {counts} spikes in {steps} judged naive steps"
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
    if reward.shown(+1) or mismatch.shown(+1):
        verdict = REPRODUCED
    elif reward.settled_against(+1) and mismatch.settled_against(+1):
        verdict = NOT_REPRODUCED
    else:
        verdict = NOT_SETTLED
    return Claim(claim, verdict, evidence)


def _recipe(runs) -> Claim:
    claim = "the full recipe (all three, BF16 last 15% and shared experts) tracks BF16 without spikes"
    if why := _missing(runs, "recipe", "bf16"):
        return Claim(claim, NOT_RUN, why)
    reward = _diff(runs, "bf16", "recipe", "final_reward")
    spikes = sum(r.spikes for r in runs["recipe"])
    evidence = f"last-10 reward BF16 vs recipe {reward.text()}; {spikes} recipe spikes"
    if spikes or reward.shown(+1):
        verdict = NOT_REPRODUCED  # BF16's reward above the recipe's is shown, or the recipe spiked
    elif reward.stderr is None:
        verdict = NOT_SETTLED
    else:
        verdict = REPRODUCED  # no shown gap: tracking within the grid's resolution, not proof of equality
    return Claim(claim, verdict, evidence)


def _pairs(runs) -> Claim:
    claim = "with any two of the three techniques (no BF16 layers), spikes remain"
    present = [p for p in PAIRS if p in runs]
    if not present:
        return Claim(claim, NOT_RUN, f"no run of {', '.join(PAIRS)} in this file")
    counts = {p: sum(r.spikes for r in runs[p]) for p in present}
    evidence = "; ".join(f"{p}: {n} spikes in {len(runs[p])} runs" for p, n in counts.items())
    missing = [p for p in PAIRS if p not in runs]
    if missing:
        evidence += f"; no run of {', '.join(missing)}"
    if not all(counts.values()):
        verdict = NOT_REPRODUCED
    else:
        verdict = REPRODUCED if not missing else NOT_SETTLED
    return Claim(claim, verdict, evidence)


def _mxfp8(runs) -> Claim:
    claim = "MXFP8 lies between BF16 and naive NVFP4 in mismatch"
    if why := _missing(runs, "mxfp8", "bf16", "nvfp4_naive"):
        return Claim(claim, NOT_RUN, why)
    above_bf16 = _diff(runs, "mxfp8", "bf16", "logprob_abs_diff")
    below_naive = _diff(runs, "nvfp4_naive", "mxfp8", "logprob_abs_diff")
    evidence = f"mean |Δlogprob| MXFP8 vs BF16 {above_bf16.text(4)}; naive vs MXFP8 {below_naive.text(4)}"
    return Claim(claim, _verdict([(above_bf16, +1), (below_naive, +1)]), evidence)


def markdown(claims_: list[Claim]) -> str:
    """The verdicts as a GitHub-markdown table."""
    lines = ["| claim | verdict | evidence (mean over seeds; Δ ± standard error where two seeds or more) |",
             "|---|---|---|"]  # fmt: skip
    lines += [f"| {c.claim} | {c.verdict} | {c.evidence.replace('|', chr(92) + '|')} |" for c in claims_]
    return "\n".join(lines) + "\n"
