"""``nibble report run DIR``: the dashboard's main panels as one PNG, from the run's own data.

With a TSDB (``nibble run --prometheus``) each main panel's PromQL is evaluated by a Prometheus started
on a copy of ``DIR/prometheus/data`` over the run's time span, exactly as Grafana would ask. Without
one, the panels the trainer's ``metrics.jsonl`` also records are drawn from it (per step, by wall time).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from nibble.analysis.run_report import read_lines
from nibble.monitoring import prometheus
from nibble.monitoring.panels import Panel, promql, rows
from nibble.monitoring.rules import HEADROOM_MARGIN
from nibble.simulator.drift_model import drift_headroom

Series = list[tuple[str, list[tuple[float, float]]]]
"""A panel's data: (legend, [(Unix time, value)]) per series."""

RECORDED: dict[str, Callable[[dict], float | None]] = {
    "Reward": lambda line: line.get("reward_mean"),
    "Held-out accuracy": lambda line: line.get("eval_accuracy"),
    "Drift headroom": lambda line: None if line.get("logprob_abs_diff") is None else drift_headroom(
        line["logprob_abs_diff"]
    ),
    "|Δlogprob| train − rollout": lambda line: line.get("logprob_abs_diff"),
    "Mean staleness": lambda line: line.get("staleness_mean"),
}  # fmt: skip
"""The main panels ``metrics.jsonl`` can stand in for: the trainer's per-step value of the same quantity."""
LEAD_SECONDS = 30.0  # before the first record: the services' start-up
TAIL_SECONDS = 5.0  # after the last: short, or series whose Prometheus stopped look flat for 5 minutes


def main_panels() -> list[Panel]:
    """The dashboard's panels marked ``main``, in dashboard order."""
    return [panel for row in rows(HEADROOM_MARGIN) for panel in row.panels if panel.main]


def run_window(run: Path) -> tuple[float, float]:
    """The run's span (Unix seconds, from start-up to just after the last step) from ``metrics.jsonl``.

    Raises:
        ValueError: ``run`` has no trainer records.
    """
    times = [line["time"] for line in read_lines(run) if "time" in line]
    if not times:
        raise ValueError(f"{run}: no metrics.jsonl records (is it a `nibble run --out` directory?)")
    return min(times) - LEAD_SECONDS, max(times) + TAIL_SECONDS


@contextmanager
def tsdb_reader(run: Path, port: int, timeout: float = 60.0) -> Iterator[Callable[[str], list]]:
    """A PromQL reader of the run's TSDB: a Prometheus on a copy of ``run/prometheus/data`` (nothing the
    run stored changes), stopped on exit. The reader takes an expression (Grafana variables allowed) and
    returns :func:`prometheus.query_range` over the run's span.

    Raises:
        ValueError: ``run`` has no records; RuntimeError: Prometheus is missing, did not start, or refused.
    """
    start, end = run_window(run)
    step = max(2.0, (end - start) / 400)
    with tempfile.TemporaryDirectory(prefix="nibble-report-") as scratch:
        data = Path(scratch) / "data"
        shutil.copytree(run / "prometheus" / "data", data, ignore=shutil.ignore_patterns("lock"))
        config = Path(scratch) / "prometheus.yml"
        config.write_text("global: {}\n")
        # old runs must not fall out of retention when this Prometheus opens them
        command = prometheus.argv(config, data, port, retention="100y")
        log_path = Path(scratch) / "prometheus.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            try:
                try:
                    prometheus.wait_ready(url, timeout, alive=lambda: process.poll() is None)
                except RuntimeError as exc:  # the log goes with the scratch directory: quote it
                    raise RuntimeError(
                        f"{exc} (reading {run}/prometheus/data): {log_path.read_text()[-1500:]}"
                    ) from None
                yield lambda expr: prometheus.query_range(url, promql(expr), start, end, step)
            finally:
                process.terminate()
                process.wait(timeout=30)


def from_tsdb(run: Path, panels: list[Panel], port: int) -> dict[str, Series]:
    """Each panel's series over the run's span, from the run's TSDB (:func:`tsdb_reader`)."""
    with tsdb_reader(run, port) as read:
        return {
            panel.title: [
                (_legend(query.legend, labels), points)
                for query in panel.queries
                for labels, points in read(query.expr)
            ]
            for panel in panels
        }


def from_records(run: Path, panels: list[Panel]) -> dict[str, Series]:
    """The panels of :data:`RECORDED` from ``metrics.jsonl`` (others are left out)."""
    lines = [line for line in read_lines(run) if "time" in line]
    found = {}
    for panel in panels:
        if panel.title in RECORDED:
            value = RECORDED[panel.title]
            points = [(line["time"], value(line)) for line in lines if value(line) is not None]
            found[panel.title] = [(panel.queries[0].legend, points)]
    return found


def _legend(template: str, labels: dict[str, str]) -> str:
    text = template
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def render(panels: list[Panel], data: dict[str, Series], path: Path, title: str) -> Path:
    """One PNG: a grid of the panels that have data, each titled and labelled with its unit, reference
    lines (the headroom's critical value and alert margin) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    shown = [panel for panel in panels if data.get(panel.title)]
    if not shown:
        raise ValueError(f"no data for any of {[p.title for p in panels]}")
    columns = 2
    rows_count = (len(shown) + columns - 1) // columns
    fig, axes = plt.subplots(rows_count, columns, figsize=(12, 3.2 * rows_count), squeeze=False)
    for ax, panel in zip(axes.flat, shown, strict=False):
        for legend, points in data[panel.title]:
            if points:
                times, values = zip(*points, strict=True)
                marker = "." if len(points) < 30 else None
                ax.plot([datetime.fromtimestamp(t) for t in times], values, label=legend, marker=marker)
        for line in panel.lines:
            ax.axhline(line.value, color=line.color, linestyle="--", linewidth=1, label=line.label)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(_unit_label(panel.unit), fontsize=8)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _unit_label(unit: str) -> str:
    """A Grafana unit id as an axis label."""
    named = {"percentunit": "fraction", "none": "", "s": "seconds", "Bps": "bytes/s", "cps": "per second", "short": ""}
    return named.get(unit, unit.removeprefix("suffix:").strip())
