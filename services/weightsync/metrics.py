"""Weight-sync's Prometheus metrics (DESIGN.md §6 names, label ``role="weightsync"``) in a private
registry, served on ``/metrics``. Every label set known at start-up exists from the start at zero."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from nibble.transport.weights import REASONS

ROLE = "weightsync"
REJECT_REASONS = (*REASONS, "stale_version", "bad_plan", "bad_tensor", "bad_token")
"""Every ``reason`` label of ``nibble_rejected_total``: the assembler's, plus a version not above the
newest held, an unreadable plan, tensors the plan cannot quantise, and a missing or wrong token."""


class WeightSyncMetrics:
    """The metrics, each bound to ``role="weightsync"``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._version = Gauge("nibble_policy_version", "weight version held", ["role"], registry=r)
        self._bytes = Counter(
            "nibble_weight_bytes",
            "bytes moved for weights: chunk data received from the trainer, chunk messages sent to samplers",
            ["role", "direction"],
            registry=r,
        )
        self._rejected = Counter("nibble_rejected", "inputs rejected at a boundary", ["role", "reason"], registry=r)
        self._rel_error = Gauge(
            "nibble_quant_rel_error",
            "relative MSE of quantised weights vs their bf16 cast",
            ["role", "layer"],
            registry=r,
        )
        self._four_over_six = Gauge(
            "nibble_four_over_six_fraction", "fraction of NVFP4 weight blocks that chose map-to-4", ["role"], registry=r
        )
        self._version.labels(role=ROLE).set(0)
        self._four_over_six.labels(role=ROLE).set(0)
        for direction in ("received", "sent"):
            self._bytes.labels(role=ROLE, direction=direction)
        for reason in REJECT_REASONS:
            self._rejected.labels(role=ROLE, reason=reason)

    def set_version(self, version: int) -> None:
        self._version.labels(role=ROLE).set(version)

    def add_bytes(self, direction: str, nbytes: int) -> None:
        self._bytes.labels(role=ROLE, direction=direction).inc(nbytes)

    def reject(self, reason: str) -> None:
        self._rejected.labels(role=ROLE, reason=reason).inc()

    def set_quality(self, rel_error: dict[str, float], four_over_six_fraction: float) -> None:
        for layer, value in rel_error.items():
            self._rel_error.labels(role=ROLE, layer=layer).set(value)
        self._four_over_six.labels(role=ROLE).set(four_over_six_fraction)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when absent), e.g. ``value("nibble_rejected_total", reason="bad_checksum")``."""
        found = self.registry.get_sample_value(name, {"role": ROLE, **labels})
        return 0.0 if found is None else found

    def serve(self, host: str, port: int):
        """Start ``/metrics`` on ``host:port`` (0 = any free port); returns the HTTP server (``server_port``)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
