"""The weight-sync service (docs/design.md §5): versioned weight store, quantise-once, fan-out to samplers.

``main`` is the entry point (``python -m nibble.weightsync --config FILE`` or ``nibble weightsync``);
``server`` holds the gRPC servers, ``store`` the versions on disk, ``quality`` what it measures of the
quantisation (the metric families are ``nibble.monitoring.metrics``'s, as for every service). This module
imports none of them, so the entry point parses its config before torch loads.
"""
