"""Real services the tests run against (one place): a throw-away ``redis-server``, a ``prometheus`` and an
``sglang-router``, each on a free loopback port."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis

from nibble.config import RedisConfig
from nibble.launcher import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def stop_process(process: subprocess.Popen | None, timeout: float) -> None:
    """SIGTERM a running server, SIGKILL it if it has not exited within ``timeout`` seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_launcher(process: subprocess.Popen, timeout: float = 30.0) -> tuple:
    """Stop a ``nibble run`` launcher and, through it, every child it started; returns what
    ``process.communicate()`` returns (the rest of its output, where that is piped).

    Its children live in sessions of their own, so a bare SIGKILL of the launcher would leave Redis,
    weight-sync, the trainer and the samplers orphaned, busy on the test machine's cores for the rest of the
    suite. So it gets Ctrl-Cs (SIGINT), the first stopping its children in order and the next killing what
    is left, one a second until it exits, its output read meanwhile (a launcher blocked writing to a full
    pipe stops nothing); only past ``timeout`` seconds SIGKILL, of its process group where it leads one
    (never the test run's own), else of the launcher alone.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.send_signal(signal.SIGINT)  # nothing once it has exited
        try:
            return process.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            continue
    try:
        leads_group = os.getpgid(process.pid) == process.pid
    except ProcessLookupError:
        leads_group = False
    if leads_group:
        os.killpg(process.pid, signal.SIGKILL)
    else:
        process.kill()
    return process.communicate()


def run_launcher(
    argv: list[str], timeout: float, env: dict[str, str] | None = None, **popen_kwargs
) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, ...)`` for a ``nibble run`` launcher
    (``popen_kwargs``, such as ``cwd``, go to ``subprocess.Popen``).

    Past ``timeout`` seconds the launcher is stopped with :func:`stop_launcher` (Ctrl-Cs, so that it stops
    every child it started, then SIGKILL), not killed outright as ``subprocess.run`` would. Raises
    ``subprocess.TimeoutExpired`` (with the output so far) as ``subprocess.run`` does.
    """
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen_kwargs
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = stop_launcher(process)
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


class RedisServer:
    """A ``redis-server`` child process: no persistence, ``noeviction`` unless told otherwise, its files in
    ``directory``. ``stop()`` ends it; ``start()`` brings it back on the same port (empty)."""

    def __init__(self, directory: Path, *extra_args: str, port: int | None = None, tls: bool = False):
        self.directory, self.extra_args = Path(directory), extra_args
        self.port = port or free_port()
        self.ca_file = self.directory / "ca.crt" if tls else None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.ca_file else 'redis'}://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--maxmemory-policy", "noeviction", "--dir", str(self.directory), "--logfile", "redis.log"]
        if self.ca_file is not None:
            make_certificates(self.directory)
            args[1:3] = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", "server.crt", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt"]
        self.process = subprocess.Popen([*args, *self.extra_args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_until_up(timeout)
        return self

    def stop(self) -> None:
        stop_process(self.process, timeout=10)
        self.process = None

    def client(self, **kwargs) -> redis.Redis:
        if self.ca_file is not None:
            kwargs.setdefault("ssl_ca_certs", str(self.ca_file))
        return redis.Redis.from_url(self.url, **kwargs)

    def _wait_until_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.directory / "redis.log"
                detail = log.read_text()[-2000:] if log.exists() else self.process.stderr.read().decode()
                pytest.fail(f"redis-server on port {self.port} exited ({self.process.returncode}): {detail}")
            try:
                with self.client(socket_connect_timeout=0.2) as probe:
                    probe.ping()
                return
            except redis.AuthenticationError:
                return  # up, and wants a password
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        pytest.fail(f"redis-server on port {self.port} did not answer within {timeout} s")


def make_certificates(directory: Path) -> None:
    """A throw-away CA (``ca.crt``) and a server certificate for 127.0.0.1 it signed (``server.crt/.key``)."""
    if (directory / "server.crt").exists():
        return
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    signed = ["-out", "server.crt", "-days", "1", "-extfile", "san.ext"]
    for command in (
        ["req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=nibble test CA"],
        ["req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", *signed],
    ):
        subprocess.run(["openssl", *command], cwd=directory, check=True, capture_output=True)


def redis_config(url: str, **overrides) -> RedisConfig:
    """A RedisConfig with stream and key names of its own, so tests sharing one server never meet."""
    run = f"test-{uuid.uuid4().hex[:12]}:"
    names = {
        "stream": f"{run}trajectories",
        "dead_letter_stream": f"{run}trajectories:dead",
        "key_prefix": run,
        "retry_seconds": 2.0,
    }
    return RedisConfig(url=url, **{**names, **overrides})


PROMETHEUS = shutil.which("prometheus")


class PrometheusServer:
    """A ``prometheus`` child process on a free loopback port, its data in ``directory``, scraping
    ``targets`` (job name → ``host:port`` addresses of ``/metrics``) every second. Use as a context manager."""

    def __init__(self, directory: Path, targets: dict[str, list[str]]):
        if PROMETHEUS is None:
            raise FileNotFoundError("prometheus is not installed (scripts/setup installs Debian's)")
        self.directory, self.targets = Path(directory), targets
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> PrometheusServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        jobs = [{"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in self.targets.items()]
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}
        (self.directory / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = (self.directory / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.directory / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        return self

    def __exit__(self, *exc_info) -> None:
        stop_process(self.process, timeout=15)
        self.log.close()

    def api(self, path: str, **params: str) -> object:
        """The ``data`` of a successful HTTP API answer (``/api/v1/<path>``)."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def wait_until_scraped(self, timeout: float = 60.0) -> None:
        """Until every target was scraped successfully at least once (fails naming the ones that were not)."""
        deadline = time.monotonic() + timeout
        health: dict[str, str] = {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited ({self.process.returncode}): {self.log_tail()}")
            try:
                active = self.api("targets", state="active")["activeTargets"]
            except OSError:
                active = []  # not listening yet
            health = {t["scrapeUrl"]: t["health"] for t in active}
            if len(health) == sum(map(len, self.targets.values())) and set(health.values()) == {"up"}:
                return
            time.sleep(0.5)
        pytest.fail(f"prometheus did not scrape every target within {timeout} s: {health} {self.log_tail()}")

    def log_tail(self) -> str:
        """The end of Prometheus's own log (for failure messages)."""
        return (self.directory / "prometheus.log").read_text()[-2000:]


class SGLangRouter:
    """The real ``sglang-router`` (PyPI ``sglang-router``, the dev extra; its Rust router, not the debugging
    MiniLB) in a child process on a free loopback port, round-robin over ``worker_urls``, its Prometheus
    exporter on another free port. Use as a context manager; skips the test when the package is missing."""

    def __init__(self, directory: Path, worker_urls: list[str]):
        try:
            import sglang_router  # noqa: F401
        except ImportError:
            pytest.skip("sglang-router is not installed (it is in the dev extra: pip install sglang-router==0.3.2)")
        self.directory, self.worker_urls = Path(directory), worker_urls
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> SGLangRouter:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log = (self.directory / "router.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *self.worker_urls,
             "--host", "127.0.0.1", "--port", str(self.port), "--policy", "round_robin",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "info"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        return self

    def __exit__(self, *exc_info) -> None:
        stop_process(self.process, timeout=15)
        self.log.close()

    def log_tail(self) -> str:
        return (self.directory / "router.log").read_text(errors="replace")[-3000:]
