"""A local Prometheus for ``nibble run --prometheus`` and ``nibble report run``: its configuration, its
command line, waiting for it, and reading from it over the HTTP API.

Debian's ``prometheus`` package provides the binary (``scripts/setup`` installs it). The run's TSDB
lives in ``<run>/prometheus/data``; ``nibble report run`` reads a copy of it, so a report never changes
what the run stored.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from nibble.monitoring.rules import Thresholds, rules_yaml

SCRAPE_INTERVAL = "2s"  # a local run is short: minutes, not hours


@dataclass(frozen=True)
class Target:
    """A process serving ``/metrics``: its name (Prometheus' ``pod`` label, as in Kubernetes), role, address."""

    pod: str
    role: str
    address: str


def binary() -> str:
    """The ``prometheus`` executable.

    Raises:
        RuntimeError: it is not installed (the message says how to install it).
    """
    found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError(
            "--prometheus needs the prometheus binary, which is not on PATH: install Debian's package "
            "(apt-get install prometheus; scripts/setup does) or run without --prometheus"
        )
    return found


def write_config(directory: Path, targets: list[Target], thresholds: Thresholds | None = None) -> Path:
    """``prometheus.yml`` (one job per role, each target labelled with its pod) and ``rules.yaml`` in
    ``directory``; returns the configuration's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rules.yaml").write_text(rules_yaml(thresholds))
    jobs = []
    for role in sorted({t.role for t in targets}):
        static = [{"targets": [t.address], "labels": {"pod": t.pod}} for t in targets if t.role == role]
        jobs.append({"job_name": role, "static_configs": static})
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                   "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": ["rules.yaml"],
        "scrape_configs": jobs,
    }  # fmt: skip
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def argv(config: Path, data: Path, port: int, *, retention: str = "15d") -> list[str]:
    """The command line of a Prometheus on ``127.0.0.1:port`` with its TSDB in ``data``."""
    return [
        binary(),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def wait_ready(url: str, timeout: float, alive=lambda: True) -> None:
    """Until ``url``'s ``/-/ready`` answers 200.

    Raises:
        RuntimeError: not ready within ``timeout`` seconds, or ``alive()`` turned false.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"prometheus at {url} exited before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"prometheus at {url} was not ready within {timeout} s")


def api(url: str, path: str, **params: str | float) -> object:
    """The ``data`` of an ``/api/v1/<path>`` answer.

    Raises:
        RuntimeError: Prometheus answered with an error (the message carries its explanation).
    """
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=30) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


Points = list[tuple[float, float]]


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[tuple[dict, Points]]:
    """Each series of ``expr`` over ``[start, end]`` (Unix seconds): its labels and ``(time, value)`` points."""
    data = api(url, "query_range", query=expr, start=start, end=end, step=step)
    return [(s["metric"], [(float(t), float(v)) for t, v in s["values"]]) for s in data["result"]]
