"""Prometheus metrics of docs/design.md §6: one definition of every name, label and bucket.

Each service builds a :class:`Metrics` on its own ``CollectorRegistry`` (so tests can run several in
one process) with its ``role``; every series a role reports is created at start-up with zero values,
so dashboards and alerts see it before the first event.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from nibble.monitoring.reasons import DEAD_LETTER_REASONS, WEIGHT_REASONS

ROLES = ("sampler", "trainer", "weightsync")
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16)
IS_WEIGHT_BUCKETS = (0.125, 0.177, 0.25, 0.354, 0.5, 0.707, 1.0, 1.414, 2.0, 2.83, 4.0, 5.66, 8.0)
RESPONSE_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
SYNC_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

ROLE_LABELLED = ("nibble_policy_version", "nibble_tokens_total", "nibble_weight_bytes_total")
"""The families labelled ``role`` (docs/design.md §6); :meth:`Metrics.value` fills that label in for them."""

# Reasons pre-created so their series exist from the start (more could appear as they happen). Every
# role pre-creates all of them, so a scrape of any service lists every series of every family.
REJECT_REASONS = (
    *WEIGHT_REASONS,
    "stale_version",
    "bad_plan",
    "bad_tensor",
    "layout_mismatch",
    "bad_token",
    "bad_response",
    "refused_group",
    "fetch_failed",
)
"""Every ``reason`` of ``nibble_rejected_total``: weight-sync's (the weight assembler's reasons, a version
not above the newest held, an unreadable plan, tensors the plan cannot quantise, a layout that differs
from the versions held, a missing or wrong bearer token) and the sampler's (a fetched version that
failed verification or does not fit its model: ``bad_manifest``; a fetch that failed in transport and is
retried: ``fetch_failed``; responses removed from a group: ``bad_response``; a group the stream's
validation refused to write: ``refused_group``)."""


class Metrics:
    """All metric families, registered on ``registry`` and initialised for ``role``.

    Gauges without a ``role`` label are owned by the trainer (it alone sees batches) but exist in
    every registry so a scrape of any role lists them with zero values.
    """

    def __init__(self, role: str, registry: CollectorRegistry | None = None):
        if role not in ROLES:
            raise ValueError(f"role={role!r} is not one of {ROLES}")
        self.role = role
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.policy_version = Gauge("nibble_policy_version", "weight version held", ["role"], registry=r)
        self.staleness = Histogram(
            "nibble_staleness_steps",
            "trainer version - trajectory version, per trajectory consumed",
            buckets=STALENESS_BUCKETS,
            registry=r,
        )
        self.stale_dropped = Counter(
            "nibble_stale_dropped_total", "trajectories dropped for exceeding max_staleness", registry=r
        )
        self.mismatch_kl = Gauge("nibble_mismatch_kl", "k3 KL(sampler || trainer) per token, last batch", registry=r)
        self.logprob_abs_diff = Gauge("nibble_logprob_abs_diff", "mean |pi_old - mu| over valid tokens", registry=r)
        self.fresh_mismatch_kl = Gauge("nibble_fresh_mismatch_kl", "mismatch_kl over staleness-0 tokens", registry=r)
        self.fresh_logprob_abs_diff = Gauge(
            "nibble_fresh_logprob_abs_diff", "logprob_abs_diff over staleness-0 tokens", registry=r
        )
        self.is_weight = Histogram(
            "nibble_is_weight", "correction ratio exp(pi_old - mu)", buckets=IS_WEIGHT_BUCKETS, registry=r
        )
        self.is_clipped_fraction = Gauge(
            "nibble_is_clipped_fraction", "fraction of tokens truncated or masked by the correction", registry=r
        )
        self.grad_norm = Gauge("nibble_grad_norm", "global gradient norm before clipping", registry=r)
        self.skipped_steps = Counter(
            "nibble_skipped_steps_total", "optimiser steps skipped for a non-finite loss or gradient", registry=r
        )
        self.entropy = Gauge("nibble_entropy", "mean per-token entropy of the trainer policy, last batch", registry=r)
        self.reward_mean = Gauge("nibble_reward_mean", "mean reward of the last batch", registry=r)
        self.eval_accuracy = Gauge("nibble_eval_accuracy", "held-out accuracy at the last evaluation", registry=r)
        self.response_tokens = Histogram(
            "nibble_response_tokens", "response length per trajectory", buckets=RESPONSE_TOKEN_BUCKETS, registry=r
        )
        self.truncated_fraction = Gauge(
            "nibble_truncated_fraction", "fraction of responses that hit the length limit", registry=r
        )
        self.zero_std_group_fraction = Gauge(
            "nibble_zero_std_group_fraction", "fraction of groups whose rewards were all equal", registry=r
        )
        self.queue_depth = Gauge(
            "nibble_queue_depth", "groups waiting in the stream (undelivered + pending)", registry=r
        )
        self.trainer_idle_seconds = Counter(
            "nibble_trainer_idle_seconds_total", "time the trainer waited for data", registry=r
        )
        self.sampler_demand = Gauge("nibble_sampler_demand", "samplers the trainer could use now", registry=r)
        self.dead_lettered = Counter(
            "nibble_dead_lettered_total", "stream entries moved to the dead-letter stream", ["reason"], registry=r
        )
        self.rejected = Counter("nibble_rejected_total", "inputs rejected at a boundary", ["reason"], registry=r)
        self.tokens = Counter(
            "nibble_tokens_total", "tokens generated (sampler) / trained (trainer)", ["role"], registry=r
        )
        self.weight_sync_seconds = Histogram(
            "nibble_weight_sync_seconds",
            "publish-to-applied latency per sampler",
            buckets=SYNC_SECONDS_BUCKETS,
            registry=r,
        )
        self.weight_bytes = Counter(
            "nibble_weight_bytes_total",
            "bytes moved for weights: published (trainer), received plus served (weightsync), fetched (sampler)",
            ["role"],
            registry=r,
        )
        self.quant_rel_error = Gauge(
            "nibble_quant_rel_error", "relative MSE of NVFP4 weights vs their bf16 cast", ["layer"], registry=r
        )
        self.four_over_six_fraction = Gauge(
            "nibble_four_over_six_fraction", "fraction of blocks that chose map-to-4", registry=r
        )
        self.drift_headroom = Gauge(
            "nibble_drift_headroom",
            "critical mismatch minus the observed mismatch (docs/design.md section 7)",
            registry=r,
        )
        self._initialise()

    def _initialise(self) -> None:
        for family in (self.policy_version, self.tokens, self.weight_bytes):
            family.labels(role=self.role)
        for reason in DEAD_LETTER_REASONS:
            self.dead_lettered.labels(reason=reason)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason=reason)
        self.quant_rel_error.labels(layer="all")

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when absent), e.g. ``value("nibble_rejected_total", reason="bad_checksum")``;
        ``role`` is this registry's for the role-labelled families unless given."""
        if name in ROLE_LABELLED:
            labels.setdefault("role", self.role)
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def serve(self, port: int, host: str = "127.0.0.1", keys: tuple[str, str] | None = None) -> WSGIServer:
        """Expose ``/metrics`` over HTTP on ``host:port`` (0 = any free port) from a daemon thread; returns
        the server (``server_port`` is the bound port; ``shutdown()`` stops it).

        Raises:
            ValueError: ``host`` is not an address of this machine, or the port is taken; names the config
                ``keys`` (host key, port key) the values came from.
        """
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError; an over-long name a UnicodeError
            where = f"{keys[0]}={host!r}, {keys[1]}={port}" if keys else f"{host}:{port}"
            raise ValueError(f"cannot serve /metrics on {where}: {exc}") from None
        return server
