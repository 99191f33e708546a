"""Watching a run: the dashboard's panels, Prometheus' recording and alert rules, a local Prometheus, and
the PNG report rendered from a run's TSDB (``nibble report run``).

The Grafana JSON builder (:mod:`nibble.monitoring.grafana`) needs the dev extra's ``grafana-foundation-sdk``
and is imported only by ``scripts/gen_monitoring`` and the tests.
"""
