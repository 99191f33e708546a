"""Prometheus recording rules and alerts (``deploy/prometheus/rules.yaml``), written once.

Recording rules precompute the rates, ratios and quantiles the dashboard's panels use (names follow
Prometheus' ``level:metric:operations`` convention); alerts fire on them. Thresholds are parameters
(:class:`Thresholds`) so ``scripts/gen_monitoring`` can write a rules file with other margins; the README's
Monitoring section has a runbook paragraph per alert and explains how the defaults were chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from nibble.monitoring.panels import TRAINER

HEADROOM_MARGIN = 0.012
"""Default ``NibbleMismatchNearCritical`` margin (nats/token), chosen on the drift model's dynamics
(``benchmarks/headroom_margin.py``, README: Monitoring)."""


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds; durations in Prometheus' syntax (``5m``)."""

    headroom_margin: float = HEADROOM_MARGIN
    """nats/token: NibbleMismatchNearCritical fires while the drift headroom is below this."""
    headroom_for: str = "5m"
    stale_dropped_ratio: float = 0.1
    """fraction of consumed trajectories dropped for exceeding max_staleness"""
    staleness_mean: float = 2.0
    """versions: mean staleness of trained trajectories (the model's staleness cost at 2 is 0.031 nats/token)"""
    staleness_for: str = "10m"
    trainer_idle_ratio: float = 0.5
    """fraction of wall time the trainer waits for data"""
    trainer_idle_for: str = "10m"
    grad_norm_factor: float = 5.0
    """a step's gradient norm above this multiple of its 30-minute mean is a spike"""
    sampler_down_for: str = "2m"
    weight_sync_p90_seconds: float = 60.0
    weight_sync_for: str = "10m"


RATE = "2m"  # ≥ 4 scrapes at Kubernetes' usual 30 s, and smooth enough at the local 2 s


def _quantile(q: float, histogram: str, window: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket[{window}])))"


RECORDING_RULES: dict[str, str] = {
    # the trainer's batch gauges, from the trainer (every role exports them as zeros) once it has trained
    "nibble:drift_headroom": f"nibble_drift_headroom and {TRAINER}",
    "nibble:grad_norm": f"nibble_grad_norm and {TRAINER}",
    # learning
    "nibble:response_tokens:p50_rate2m": _quantile(0.5, "nibble_response_tokens", RATE),
    "nibble:response_tokens:p90_rate2m": _quantile(0.9, "nibble_response_tokens", RATE),
    # staleness
    "le:nibble_staleness_steps_bucket:rate2m": f"sum by (le) (rate(nibble_staleness_steps_bucket[{RATE}]))",
    "nibble:staleness_steps:mean_rate2m": (
        f"sum(rate(nibble_staleness_steps_sum[{RATE}])) / sum(rate(nibble_staleness_steps_count[{RATE}]))"
    ),
    "nibble:stale_dropped:ratio_rate2m": (
        f"sum(rate(nibble_stale_dropped_total[{RATE}])) / "
        f"(sum(rate(nibble_stale_dropped_total[{RATE}])) + sum(rate(nibble_staleness_steps_count[{RATE}])))"
    ),
    "nibble:weight_sync_seconds:p50_rate5m": _quantile(0.5, "nibble_weight_sync_seconds", "5m"),
    "nibble:weight_sync_seconds:p90_rate5m": _quantile(0.9, "nibble_weight_sync_seconds", "5m"),
    "role:nibble_weight_bytes:rate2m": f"sum by (role) (rate(nibble_weight_bytes_total[{RATE}]))",
    # throughput
    "role_pod:nibble_tokens:rate2m": f"sum by (role, pod) (rate(nibble_tokens_total[{RATE}]))",
    "nibble:trainer_idle:ratio_rate2m": f"sum(rate(nibble_trainer_idle_seconds_total[{RATE}]))",
    "nibble:live_samplers": 'count(nibble_policy_version{role="sampler"}) or vector(0)',
    # health
    "nibble:skipped_steps:increase5m": "sum(increase(nibble_skipped_steps_total[5m]))",
    "reason:nibble_dead_lettered:rate2m": f"sum by (reason) (rate(nibble_dead_lettered_total[{RATE}]))",
    "reason:nibble_rejected:rate2m": f"sum by (reason) (rate(nibble_rejected_total[{RATE}]))",
}  # fmt: skip


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str
    severity: str
    summary: str


def alerts(t: Thresholds) -> tuple[Alert, ...]:
    """The alerts, with ``t``'s thresholds; each has a runbook paragraph in the README (Monitoring). Summaries
    name the threshold, not the value (Grafana and Alertmanager show the value beside them)."""
    return (
        Alert("NibbleMismatchNearCritical", f"nibble:drift_headroom < {t.headroom_margin}", t.headroom_for, "critical",
              f"Drift headroom is below {t.headroom_margin} nats/token: the train/rollout mismatch nears the drift "
              "model's critical value."),
        Alert("NibbleStalenessHigh",
              f"nibble:stale_dropped:ratio_rate2m > {t.stale_dropped_ratio} "
              f"or nibble:staleness_steps:mean_rate2m > {t.staleness_mean}", t.staleness_for, "warning",
              f"Trajectories are too old: over {t.stale_dropped_ratio:.0%} dropped as stale, or trained at a mean "
              f"staleness above {t.staleness_mean} versions."),
        Alert("NibbleTrainerStarved", f"nibble:trainer_idle:ratio_rate2m > {t.trainer_idle_ratio}",
              t.trainer_idle_for, "warning",
              f"The trainer waits for data over {t.trainer_idle_ratio:.0%} of the time: add samplers."),
        Alert("NibbleGradNormSpike",
              f"nibble:grad_norm > {t.grad_norm_factor} * avg_over_time(nibble:grad_norm[30m])", "0s", "warning",
              f"A step's gradient norm is over {t.grad_norm_factor}x its 30-minute mean."),
        Alert("NibbleSamplerDown", 'up == 0 and on(instance) max_over_time(nibble_policy_version{role="sampler"}[1h])',
              t.sampler_down_for, "warning",
              "Sampler {{ $labels.instance }} served metrics within the last hour and does not answer now."),
        Alert("NibbleWeightSyncSlow", f"nibble:weight_sync_seconds:p90_rate5m > {t.weight_sync_p90_seconds}",
              t.weight_sync_for, "warning",
              f"Samplers apply new weights over {t.weight_sync_p90_seconds:g} s after publication (p90): they "
              "generate with old weights."),
    )  # fmt: skip


def rules_document(thresholds: Thresholds | None = None) -> dict:
    """The rules file (Prometheus' rule-file format) as a mapping: the recording rules, then the alerts."""
    t = thresholds or Thresholds()
    recording = [{"record": name, "expr": expr} for name, expr in RECORDING_RULES.items()]
    alerting = [
        {
            "alert": a.name,
            "expr": a.expr,
            **({"for": a.duration} if a.duration != "0s" else {}),
            "labels": {"severity": a.severity},
            "annotations": {"summary": a.summary, "runbook": f"README.md#{a.name.lower()}"},
        }
        for a in alerts(t)
    ]
    # one group: Prometheus evaluates a group's rules in order, so every alert sees this evaluation's
    # recorded series (groups run on independent timers; a one-step grad-norm spike could be missed)
    return {"groups": [{"name": "nibble", "rules": recording + alerting}]}


def rules_yaml(thresholds: Thresholds | None = None) -> str:
    """:func:`rules_document` as YAML text, with a header saying where it comes from."""
    header = "# Generated by scripts/gen_monitoring from nibble/monitoring/rules.py; do not edit by hand.\n"
    return header + yaml.safe_dump(rules_document(thresholds), sort_keys=False, width=200)
