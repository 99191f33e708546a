"""A small real stack for system tests, and reading back what it did.

:class:`Stack` runs a private ``redis-server`` (append-only file on, so every write can be read back in
order), weight-sync, the trainer and samplers as separate processes started by the launcher's
``Cluster`` on ``configs/smoke.yaml``, with each service's ``/metrics`` on a known loopback port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from nibble.config import RunConfig, load
from nibble.launcher import Child, Cluster, child_environment, free_port
from nibble.trainer.main import STOPPED_EXIT_CODE
from tests.services import RedisServer

ROOT = Path(__file__).resolve().parents[2]


def resp_commands(data: bytes) -> Iterator[list[bytes]]:
    """Commands of a RESP stream (Redis's AOF format): lists of bulk strings."""
    i = 0
    while i < len(data):
        assert data[i : i + 1] == b"*", data[i : i + 20]
        end = data.index(b"\r\n", i)
        count, i = int(data[i + 1 : end]), end + 2
        parts = []
        for _ in range(count):
            end = data.index(b"\r\n", i)
            length, i = int(data[i + 1 : end]), end + 2
            parts.append(data[i : i + length])
            i += length + 2
        yield parts


def aof_commands(redis_dir: Path) -> Iterator[list[bytes]]:
    """Every write a ``redis-server`` with ``--appendonly yes`` in ``redis_dir`` logged, in order (scripts
    appear as their effects: the INCR, SET or DECRBY they ran)."""
    for file in sorted((redis_dir / "appendonlydir").glob("*.aof")):
        yield from resp_commands(file.read_bytes())


def metrics_lines(out: Path) -> list[dict]:
    """The trainer's records (``metrics.jsonl``), one per step, step 0 being the warm start's evaluation."""
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def wait_for_step(out: Path, step: int, timeout: float = 240, alive: Callable[[], None] | None = None) -> None:
    """Until the trainer has recorded ``step``; ``alive()`` (raising when a process died) is polled too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(x["step"] >= step for x in metrics_lines(out)):
            return
        if alive is not None:
            alive()
        time.sleep(0.2)
    raise AssertionError(f"the trainer did not reach step {step} in {timeout} s")


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """A ``/metrics`` page over HTTP: every sample's value by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    families = text_string_to_metric_families(text)
    return {(s.name, frozenset(s.labels.items())): s.value for family in families for s in family.samples}


class Stack:
    """Weight-sync, the trainer and ``samplers`` samplers on configs/smoke.yaml with ``trainer`` overrides.

    Attributes:
        config: the effective config; ``out``: the trainer's and samplers' output directory;
        metrics_ports: each service's ``/metrics`` port by process name (``sampler-<i>`` for samplers);
        env: the children's environment additions (the run's bearer tokens).
    """

    def __init__(self, directory: Path, warm_start: Path, *, samplers: int = 2, **trainer):
        self.directory, self.out = directory, directory / "run"
        self.redis = RedisServer(directory / "redis", "--appendonly", "yes", "--appendfsync", "always")
        self.metrics_ports = {name: free_port() for name in ("weightsync", "trainer")}
        self.metrics_ports.update({f"sampler-{i}": free_port() for i in range(samplers)})
        data = load(ROOT / "configs" / "smoke.yaml").model_dump(mode="json")
        data["model"]["checkpoint"] = str(warm_start)
        data["redis"]["url"] = self.redis.url
        data["weightsync"].update(
            port=free_port(),
            publish_port=free_port(),
            metrics_port=self.metrics_ports["weightsync"],
            store_dir=str(self.out / "weights"),
        )
        data["trainer"].update(
            checkpoint_dir=str(self.out / "trainer"), metrics_port=self.metrics_ports["trainer"], **trainer
        )
        self.config = RunConfig.model_validate(data)
        self._data = data
        self.env = child_environment()
        self.cluster = Cluster(self.out, env=self.env)
        self.trainer: Child | None = None
        self.trainer_metrics: dict[tuple[str, frozenset], float] = {}

    def start(self, timeout: float = 180) -> Stack:
        """Start every process and wait until each serves ``/metrics`` (models loaded, clients connected)."""
        deadline = time.monotonic() + timeout
        self.redis.start()
        self.cluster.start_service("weightsync", "nibble.weightsync", self._config_file("run", {}))
        self._wait_until_serving(["weightsync"], deadline)  # the trainer asks it for the latest version first
        self.trainer = self.cluster.start_service(
            "trainer", "nibble.trainer", self._config_file("run", {}), "--out", str(self.out)
        )
        for name in self.metrics_ports:
            if name.startswith("sampler-"):
                config = self._config_file(name, {"metrics_port": self.metrics_ports[name]})
                self.cluster.start_service(name, "nibble.sampler", config, "--name", name, "--out", str(self.out))
        self._wait_until_serving(list(self.metrics_ports), deadline)
        return self

    def _wait_until_serving(self, names: list[str], deadline: float) -> None:
        waiting = set(names)
        while waiting:
            self.check_alive()
            for name in sorted(waiting):
                try:
                    scrape(self.metrics_ports[name])
                    waiting.discard(name)
                except OSError:
                    pass
            if waiting and time.monotonic() > deadline:
                raise AssertionError(f"{sorted(waiting)} did not serve /metrics in time")
            time.sleep(0.2)

    def _config_file(self, name: str, sampler: dict) -> Path:
        path = self.directory / f"{name}.yaml"
        if not path.exists():
            data = {**self._data, "sampler": {**self._data["sampler"], **sampler}}
            path.write_text(yaml.safe_dump(data))
        return path

    def check_alive(self) -> None:
        """Raise, with its log's tail, when a process has exited with an error (or a service at all; the
        trainer may have finished or been stopped)."""
        for child in self.cluster.children:
            code = child.process.poll()
            if code is not None and (code not in (0, STOPPED_EXIT_CODE) or child is not self.trainer):
                raise AssertionError(f"{child.name} exited with {code}:\n{child.log.read_text()[-3000:]}")

    def value(self, process: str, name: str, **labels: str) -> float:
        """A sample's value on ``process``'s ``/metrics`` right now (``KeyError`` when absent)."""
        return scrape(self.metrics_ports[process])[(name, frozenset(labels.items()))]

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
        """Until ``condition()`` holds, checking that every process is alive meanwhile."""
        deadline = time.monotonic() + timeout
        while not condition():
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout} s")
            time.sleep(0.2)

    def wait_for_step(self, step: int, timeout: float = 240) -> None:
        """Until the trainer has recorded ``step`` (failing early when a process died)."""
        wait_for_step(self.out, step, timeout, alive=self.check_alive)

    def steps(self) -> list[dict]:
        """The trainer's records of its steps (step ≥ 1)."""
        return [x for x in metrics_lines(self.out) if x["step"] > 0]

    def finish_training(self, min_steps: int) -> None:
        """Once ``min_steps`` steps are recorded, keep the trainer's last scrape in ``trainer_metrics`` and
        stop it with SIGTERM (it finishes its step, checkpoints, and exits 143: stopped, not finished);
        weight-sync and the samplers keep running. Does nothing when the trainer has stopped already."""
        assert self.trainer is not None
        if self.trainer.process.poll() is not None:
            return
        self.wait_for_step(min_steps)
        self.trainer_metrics = scrape(self.metrics_ports["trainer"])
        os.kill(self.trainer.process.pid, signal.SIGTERM)
        try:
            code = self.trainer.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError("the trainer did not stop within 120 s of SIGTERM") from None
        assert code == STOPPED_EXIT_CODE, self.trainer.log.read_text()[-3000:]

    def logs(self) -> dict[str, str]:
        """Each process's log so far, by process name."""
        return {child.name: child.log.read_text() for child in self.cluster.children}

    def stop(self) -> None:
        """SIGTERM every process (the launcher's grace period, then SIGKILL), then stop Redis."""
        self.cluster.stop()
        self.redis.stop()
