"""Offline analysis of what runs and benchmarks leave behind: train/rollout mismatch per precision plan
(``mismatch_report``), quantisation error per number format (``quant_error``), ``nibble run``'s summary and
plots (``run_report``), the stability grid's summary (``stability_report``) and the spike/collapse event
definitions it counts (``stability_events``).

Each module is imported by its command (``nibble mismatch``, ``nibble quant-error``, ``nibble report``) or
benchmark; nothing is re-exported here, so reading a report never imports torch."""
