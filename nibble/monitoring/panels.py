"""What the Grafana dashboard shows, written once: rows of panels, each a title, a unit and PromQL queries.

The Grafana JSON (:mod:`nibble.monitoring.grafana`), ``nibble report run`` and the end-to-end test read
these specs, so the committed dashboard, the PNG report and what the tests prove can never disagree.

Queries may use Grafana's template variables ``$role``, ``$pod`` (regexes; "All" is ``.*``) and
``$__rate_interval``; :func:`promql` replaces them for a plain Prometheus.

Every §6 metric is exported by every role with zero values (docs/design.md §6), but most gauges are set by one
role only: :data:`TRAINER` and :data:`WEIGHTSYNC` keep the owner's series, joined on ``instance``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TRAINER = 'on(instance) (nibble_tokens_total{role="trainer"} > 0)'
"""Right-hand side of ``and``: the trainer's instance once it has trained a batch (its batch gauges are
meaningless before: zero-initialised)."""
WEIGHTSYNC = 'on(instance) nibble_policy_version{role="weightsync"}'
"""Right-hand side of ``and``: weight-sync's instance (it alone quantises, so owns the quantisation gauges)."""
PER_TOKEN = "suffix: nats/token"
"""Grafana custom unit of the mismatch measures (natural-log probabilities)."""


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a panel and its series' legend (Grafana's ``{{label}}`` syntax)."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Line:
    """A horizontal reference line (a Grafana threshold drawn as a line): ``value`` in the panel's unit."""

    value: float
    label: str
    color: str


@dataclass(frozen=True)
class Panel:
    """A dashboard panel: ``kind`` is ``timeseries`` or ``heatmap`` (queries then return ``le`` buckets);
    ``unit`` is a Grafana unit id; ``main`` panels are the ones ``nibble report run`` renders."""

    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str
    kind: str = "timeseries"
    lines: tuple[Line, ...] = ()
    main: bool = False


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def trainer_gauge(name: str, legend: str) -> Query:
    """A gauge only the trainer sets, from the trainer's series."""
    return Query(f'{name}{{pod=~"$pod"}} and {TRAINER}', legend)


def weightsync_gauge(name: str, legend: str) -> Query:
    """A gauge only weight-sync sets, from weight-sync's series."""
    return Query(f'{name}{{pod=~"$pod"}} and {WEIGHTSYNC}', legend)


def rows(headroom_margin: float) -> tuple[Row, ...]:
    """The dashboard's rows; ``headroom_margin`` (nats/token) is drawn on the headroom panel beside the
    critical line, at the level where ``NibbleMismatchNearCritical`` fires."""
    return (
        Row("Learning", _learning()),
        Row("Drift", _drift(headroom_margin)),
        Row("Staleness", _staleness()),
        Row("Throughput", _throughput()),
        Row("Health", _health()),
    )


def _learning() -> tuple[Panel, ...]:
    return (
        Panel("Reward", "none", (trainer_gauge("nibble_reward_mean", "batch mean"),),
              "Mean reward of the last trained batch.", main=True),
        Panel("Held-out accuracy", "percentunit", (trainer_gauge("nibble_eval_accuracy", "held-out"),),
              "Accuracy on the task's held-out prompts at the last evaluation.", main=True),
        Panel("Gradient norm", "none", (Query('nibble:grad_norm{pod=~"$pod"}', "before clipping"),),
              "Global gradient norm before clipping; NibbleGradNormSpike compares it with its 30-minute mean."),
        Panel("Entropy", PER_TOKEN, (trainer_gauge("nibble_entropy", "trainer policy"),),
              "Mean per-token entropy of the trainer policy over the last batch."),
        Panel("Response length", "suffix: tokens", (
            Query("nibble:response_tokens:p50_rate2m", "p50"),
            Query("nibble:response_tokens:p90_rate2m", "p90"),
        ), "Response length per trajectory, from the samplers' histogram."),
    )  # fmt: skip


def _drift(margin: float) -> tuple[Panel, ...]:
    return (
        Panel("Drift headroom", PER_TOKEN, (Query('nibble:drift_headroom{pod=~"$pod"}', "m_c − |Δlogprob|"),),
              "Critical mismatch of the drift model minus the last batch's mean |π_old − μ| (README: Monitoring). "
              "Below 0 the schematic model has no stable drift; the alert fires below the margin.",
              lines=(Line(0.0, "critical", "red"), Line(margin, "alert margin", "orange")), main=True),
        Panel("|Δlogprob| train − rollout", PER_TOKEN, (
            trainer_gauge("nibble_logprob_abs_diff", "all trajectories"),
            trainer_gauge("nibble_fresh_logprob_abs_diff", "staleness 0 (precision alone)"),
        ), "Mean |π_old − μ| over valid response tokens of the last batch.", main=True),
        Panel("k3 mismatch KL(sampler ‖ trainer)", PER_TOKEN, (
            trainer_gauge("nibble_mismatch_kl", "all trajectories"),
            trainer_gauge("nibble_fresh_mismatch_kl", "staleness 0 (precision alone)"),
        ), "k3 estimate of KL(sampler ‖ trainer) per token, mean over the last batch."),
        Panel("IS clipped fraction", "percentunit", (trainer_gauge("nibble_is_clipped_fraction", "clipped or masked"),),
              "Fraction of tokens truncated or masked by the importance-sampling correction."),
        Panel("Four-over-six: blocks mapped to 4", "percentunit",
              (weightsync_gauge("nibble_four_over_six_fraction", "map-to-4"),),
              "Fraction of NVFP4 blocks of the last quantised version that chose the map-to-4 scale."),
        Panel("NVFP4 quantisation error by layer", "percentunit",
              (weightsync_gauge("nibble_quant_rel_error", "{{layer}}"),),
              "Relative MSE of the NVFP4 weights against their bf16 cast, per layer of the last version."),
    )  # fmt: skip


def _staleness() -> tuple[Panel, ...]:
    return (
        Panel("Staleness of trained trajectories", "suffix: versions",
              (Query("le:nibble_staleness_steps_bucket:rate2m", "{{le}}"),),
              "Trainer version − trajectory version, trajectories per second in each bucket.", kind="heatmap"),
        Panel("Mean staleness", "suffix: versions", (Query("nibble:staleness_steps:mean_rate2m", "mean"),),
              "Mean staleness of the trajectories trained in the window.", main=True),
        Panel("Stale drops", "percentunit", (Query("nibble:stale_dropped:ratio_rate2m", "dropped / consumed"),),
              "Fraction of consumed trajectories the trainer dropped for exceeding max_staleness."),
        Panel("Policy version per role", "none",
              (Query('nibble_policy_version{role=~"$role", pod=~"$pod"}', "{{role}} {{pod}}"),),
              "Weight version each process holds: samplers trail the trainer by the weight-sync delay."),
        Panel("Weight-sync latency", "s", (
            Query("nibble:weight_sync_seconds:p50_rate5m", "p50"),
            Query("nibble:weight_sync_seconds:p90_rate5m", "p90"),
        ), "Seconds from the trainer's publication to a sampler applying the version."),
        Panel("Weight bytes per role", "Bps", (Query('role:nibble_weight_bytes:rate2m{role=~"$role"}', "{{role}}"),),
              "Bytes of weights moved: published (trainer), received plus served (weightsync), fetched (sampler)."),
    )  # fmt: skip


def _throughput() -> tuple[Panel, ...]:
    return (
        Panel("Tokens per second", "suffix: tokens/s",
              (Query('sum by (role) (role_pod:nibble_tokens:rate2m{role=~"$role", pod=~"$pod"})', "{{role}}"),),
              "Tokens generated (samplers) and trained (trainer) per second.", main=True),
        Panel("Queue depth", "suffix: groups", (trainer_gauge("nibble_queue_depth", "undelivered + pending"),),
              "Groups waiting in the trajectory stream.", main=True),
        Panel("Trainer idle", "percentunit", (Query("nibble:trainer_idle:ratio_rate2m", "waiting for data"),),
              "Fraction of wall time the trainer waited for trajectories; NibbleTrainerStarved fires when high."),
        Panel("Sampler demand vs live samplers", "suffix: samplers", (
            trainer_gauge("nibble_sampler_demand", "demand (trainer)"),
            Query("nibble:live_samplers", "live"),
        ), "Samplers the trainer could use now (the autoscaling signal) against the samplers being scraped."),
    )  # fmt: skip


def _health() -> tuple[Panel, ...]:
    return (
        Panel("Skipped optimiser steps", "short", (Query("nibble:skipped_steps:increase5m", "in 5 min"),),
              "Optimiser steps skipped for a non-finite loss or gradient."),
        Panel("Dead-lettered by reason", "cps", (Query("reason:nibble_dead_lettered:rate2m", "{{reason}}"),),
              "Stream entries moved to the dead-letter stream per second, by reason."),
        Panel("Rejected by reason", "cps", (Query("reason:nibble_rejected:rate2m", "{{reason}}"),),
              "Inputs refused at a boundary per second, by reason."),
        Panel("Zero-std groups", "percentunit", (trainer_gauge("nibble_zero_std_group_fraction", "all rewards equal"),),
              "Fraction of the last batch's groups whose rewards were all equal (no learning signal)."),
        Panel("Truncated responses", "percentunit", (trainer_gauge("nibble_truncated_fraction", "hit the limit"),),
              "Fraction of the last batch's responses that hit the length limit."),
    )  # fmt: skip


TEMPLATE_DEFAULTS = {"role": ".*", "pod": ".*", "__rate_interval": "2m"}
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def promql(expr: str, **values: str) -> str:
    """``expr`` with Grafana's template variables replaced (``role``/``pod`` default to All, ``.*``;
    ``__rate_interval`` to 2m), as Prometheus' HTTP API takes it.

    Raises:
        ValueError: the expression uses a variable that has no value.
    """
    values = {**TEMPLATE_DEFAULTS, **values}

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"query {expr!r} uses ${name}, which has no value")
        return values[name]

    return _VARIABLE.sub(replace, expr)
