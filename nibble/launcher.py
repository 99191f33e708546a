"""The local launcher behind ``nibble run``: Nibble's services as processes on one machine.

It starts a private ``redis-server`` (unless given a URL), the weight-sync service, the trainer and
``num_samplers`` samplers — each a separate Python process started by command line, never imported
— shows live progress from the trainer's ``metrics.jsonl``, and stops every child on completion,
error, Ctrl-C or SIGTERM — in dependency order, each stage given time to finish cleanly: samplers first,
then the trainer (which checkpoints its last step), then weight-sync, then Redis, which the others need
until they stop. A second Ctrl-C kills what is left. Secrets (the bearer tokens) reach children through
the environment only.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from nibble.config import RunConfig, devices
from nibble.monitoring import prometheus as local_prometheus
from nibble.monitoring.prometheus import Target

STOP_GRACE_SECONDS = 20.0
STOP_GRACE_BY_STAGE = {"trainer": 180.0}
"""Seconds a stage may take to stop before it is killed: the trainer finishes its step (an evaluation of
the held-out set included, a minute on a busy 2-core machine) and writes its checkpoint."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM reached the launcher; every child was stopped, in order, before this was
    raised. ``exit_code`` is the shell's convention for the signal (130, 143)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_CHOSEN_PORT = 20000
"""Ports below stay for services users run themselves (Redis's 6379, Prometheus's 9090, databases)."""
_handed_out: set[int] = set()
"""Every port :func:`free_port` returned, passed over in later draws: its server may not have bound it yet."""
_rng = random.SystemRandom()
"""Ports are drawn from the OS's entropy, not from the ``random`` module's global generator: tests seed that
one (hypothesis does, per example), and processes seeded alike would draw the same ports in the same order."""


def _ports_outside_ephemeral() -> list[int]:
    """The ports from LOWEST_CHOSEN_PORT up to the kernel's ephemeral range and from its top up to 65535: both
    sides, so that a range starting at or below LOWEST_CHOSEN_PORT still leaves ports to draw. Empty where the
    range cannot be read (not Linux) or covers both sides."""
    try:
        low, high = map(int, EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return []
    return [*range(LOWEST_CHOSEN_PORT, low), *range(max(high + 1, LOWEST_CHOSEN_PORT), 65536)]


def _binds(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    """A free port of the kernel's choosing (``bind(0)``): one from its ephemeral range."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses now, for a server this process is about to start.

    A port the kernel hands out for ``bind(0)`` lies in its ephemeral range, from which every outgoing
    connection (a Redis client, a scrape) also takes its local port: one could take it before the server
    binds it (``Address already in use``, as a trainer's ``/metrics`` once met). So on Linux the port is
    drawn at random outside that range (``/proc/sys/net/ipv4/ip_local_port_range``): from
    ``LOWEST_CHOSEN_PORT`` up to its start, or above its top, where only servers bind. Where there are no
    such ports (not Linux, or a range that covers them), or 200 draws all find a port in use, the kernel
    chooses. Either way a port this process handed out before is passed over, as its server may not have
    bound it yet (the kernel is asked again, up to 200 times, while its choice repeats one).
    """
    candidates = _ports_outside_ephemeral()
    if candidates:
        for _ in range(200):
            port = _rng.choice(candidates)
            if port not in _handed_out and _binds(port):
                _handed_out.add(port)
                return port
    for _ in range(200):
        port = _kernel_port()
        if port not in _handed_out:
            break
    _handed_out.add(port)
    return port


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path
    stage: str = ""
    """Children of one stage stop together (all samplers); stages stop in reverse start order."""


@dataclass
class Cluster:
    """The processes of one run, stopped in reverse start order."""

    out: Path
    children: list[Child] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], stage: str = "", env: dict[str, str] | None = None) -> Child:
        """Start ``argv`` in its own session, output to ``logs/<name>.log``, stopping with ``stage`` (default:
        its own); ``env`` adds to this child's environment only."""
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        handle = log.open("ab")
        process = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env, **(env or {})},
            start_new_session=True,
        )
        handle.close()
        child = Child(name, process, log, stage or name)
        self.children.append(child)
        return child

    def start_service(
        self,
        name: str,
        module: str,
        config: Path,
        *extra: str,
        nproc_per_node: int = 1,
        stage: str = "",
        device: str = "cpu",
        env: dict | None = None,
    ) -> Child:
        """Start ``python -m module --config config *extra``; with ``nproc_per_node`` > 1 as that many
        processes under ``torchrun`` (standalone: its rendezvous on a free local port). A ``cuda:N``
        ``device`` makes GPU N the child's only visible one."""
        python = [sys.executable]
        if nproc_per_node > 1:
            python += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc_per_node)]
        argv = [*python, "-m", module, "--config", str(config), *extra]
        return self.start(name, argv, stage, {**devices.child_environment(device), **(env or {})})

    def failed(self) -> Child | None:
        """A child that exited with an error (or at all, for services that should keep running)."""
        for child in self.children:
            if child.process.poll() not in (None, 0):
                return child
        return None

    def stop(self, report: Callable[[str], None] | None = None) -> None:
        """Stop every child, stage by stage in reverse start order: SIGTERM the stage, wait for it (its grace
        period: :data:`STOP_GRACE_BY_STAGE`, else :data:`STOP_GRACE_SECONDS`), SIGKILL what is left of it,
        then the next stage. A SIGINT or SIGTERM meanwhile (a second Ctrl-C) kills everything left at once.
        ``report`` gets one line per stage (what is stopping, then how long it took)."""
        report = report or (lambda _line: None)
        hurry = threading.Event()
        with _signals_set(hurry):
            for stage in dict.fromkeys(c.stage for c in reversed(self.children)):
                children = [c for c in self.children if c.stage == stage and c.process.poll() is None]
                if children:
                    self._stop_stage(stage, children, hurry, report)

    def _stop_stage(self, stage: str, children: list[Child], hurry: threading.Event, report) -> None:
        names = ", ".join(c.name for c in children)
        report(f"stopping {stage}" + (f" ({names})" if names != stage else ""))
        started = time.monotonic()
        for child in children:
            child.process.send_signal(signal.SIGTERM)
        deadline = started + STOP_GRACE_BY_STAGE.get(stage, STOP_GRACE_SECONDS)
        while any(c.process.poll() is None for c in children):
            if hurry.is_set() or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        killed = [c.name for c in children if c.process.poll() is None]
        for child in children:
            if child.process.poll() is None:
                os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()
        took = time.monotonic() - started
        report(f"stopped {stage} in {took:.1f} s" + (f" (killed {', '.join(killed)})" if killed else ""))


@contextmanager
def _signals_set(event: threading.Event):
    """While stopping: SIGINT/SIGTERM set ``event`` instead of interrupting the orderly stop (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, lambda *_: event.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def start_redis(cluster: Cluster, directory: Path) -> str:
    """A private ``redis-server`` on a free loopback port (noeviction, AOF on); returns its URL.

    Raises:
        RuntimeError: redis-server is not installed or did not answer within 10 s.
    """
    import redis

    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--appendonly",
        "yes",
        "--save",
        "",
        "--maxmemory-policy",
        "noeviction",
    ]
    try:
        cluster.start("redis", argv)
    except FileNotFoundError as exc:
        raise RuntimeError("redis-server is not installed (scripts/setup installs Debian's)") from exc
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            client.ping()
            return url
        except redis.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server on port {port} did not answer within 10 s (see {cluster.out}/logs/redis.log)")


RUN_FOLDER_DIRECTORIES = (("trainer", "checkpoint_dir", "trainer"), ("weightsync", "store_dir", "weights"))
"""(section, field, sub-folder): directories a run keeps inside its run folder, whatever the config says."""


def replaced_directories(config: RunConfig, out: Path) -> list[str]:
    """One line per directory the config sets away from its default that the run folder ``out`` replaces
    (``nibble run`` keeps checkpoints and weights inside its run folder, so a resumed run finds them)."""
    lines = []
    for section, name, sub in RUN_FOLDER_DIRECTORIES:
        value = getattr(getattr(config, section), name)
        default = type(getattr(config, section)).model_fields[name].default
        if value != default:
            lines.append(f"{section}.{name} = {value} is replaced by the run folder's {out / sub}")
    return lines


def effective_config(config: RunConfig, out: Path, redis_url: str, *, metrics_ports: bool = False) -> RunConfig:
    """The config every child reads: the run's, with this run's ports, URL and directories (with
    ``metrics_ports``, weight-sync's and the trainer's ``/metrics`` on known ports too: free ones unless set).

    Raises:
        ValueError: the run folder's directories make the config invalid (e.g. ``weightsync.export_dir`` set
            to what becomes ``store_dir``), naming the fields.
    """
    data = config.model_dump(mode="json")
    data["redis"]["url"] = redis_url
    data["weightsync"].update(port=free_port(), publish_port=free_port())
    replaced = []
    for section, name, sub in RUN_FOLDER_DIRECTORIES:
        data[section][name] = str(out / sub)
        replaced.append(f"{section}.{name} = {out / sub}")
    for section in ("weightsync", "trainer") if metrics_ports else ():
        data[section]["metrics_port"] = data[section]["metrics_port"] or free_port()  # a configured port stays
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}".lstrip(": ") for e in exc.errors())
        raise ValueError(f"with the run folder's directories ({', '.join(replaced)}): {problems}") from None


def write_config(config: RunConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return path


def child_environment() -> dict[str, str]:
    """Fresh bearer tokens for this run (children read them from the environment)."""
    return {"NIBBLE_PUBLISH_TOKEN": secrets.token_hex(16), "NIBBLE_FETCH_TOKEN": secrets.token_hex(16)}


def launch(
    config: RunConfig,
    out: Path,
    *,
    redis_url: str | None = None,
    on_progress: Callable[[Path], None] | None = None,
    on_stop: Callable[[str], None] | None = None,
    prometheus: bool = False,
    announce: Callable[[str], None] = lambda message: None,
    poll_seconds: float = 1.0,
) -> RunConfig:
    """Run the services until the trainer finishes; return the effective config. However it ends, every
    child is stopped in order (``on_stop`` gets a line per stage) before this returns or raises.

    With ``prometheus``, a local Prometheus (:mod:`nibble.monitoring.prometheus`) scrapes every service
    with the alert and recording rules, its TSDB in ``out/prometheus/data``; ``announce`` gets its URL.

    Raises:
        ValueError: the trainer asks for more GPUs than this machine has (nothing is started).
        RuntimeError: naming the child (and its log) that failed, or Prometheus missing (nothing started).
        Interrupted: SIGINT (Ctrl-C) or SIGTERM reached this process.
    """
    check_devices(config)
    if prometheus:
        local_prometheus.binary()  # refuse before anything starts
    out.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(out, env=child_environment())
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        url = redis_url or start_redis(cluster, out / "redis")
        effective = effective_config(config, out, url, metrics_ports=prometheus)
        path = write_config(effective, out / "config.yaml")
        sampler_ports = [free_port() if prometheus else 0 for _ in range(effective.num_samplers)]
        if prometheus:
            announce(start_prometheus(cluster, out / "prometheus", targets(effective, sampler_ports)))
        cluster.start_service("weightsync", "nibble.weightsync", path)
        t, s = effective.trainer, effective.sampler
        trainer = cluster.start_service(
            "trainer", "nibble.trainer", path, "--out", str(out), nproc_per_node=t.nproc_per_node, device=t.device
        )
        for i, port in enumerate(sampler_ports):
            env = {"NIBBLE_SAMPLER__METRICS_PORT": str(port)} if port else None
            name = f"sampler-{i}"
            argv = ("--name", name, "--out", str(out))
            cluster.start_service(name, "nibble.sampler", path, *argv, stage="samplers", device=s.device, env=env)
        while trainer.process.poll() is None:
            failed = cluster.failed()
            if failed is not None:
                raise RuntimeError(f"{failed.name} exited with {failed.process.returncode}; see {failed.log}")
            if on_progress:
                on_progress(out)
            time.sleep(poll_seconds)
        if trainer.process.returncode != 0:
            raise RuntimeError(f"trainer exited with {trainer.process.returncode}; see {trainer.log}")
        if on_progress:
            on_progress(out)
        return effective
    finally:
        cluster.stop(on_stop)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def targets(config: RunConfig, sampler_ports: list[int]) -> list[Target]:
    """Every service's ``/metrics`` address, as Prometheus scrape targets."""
    found = [
        Target("weightsync", "weightsync", f"127.0.0.1:{config.weightsync.metrics_port}"),
        Target("trainer", "trainer", f"127.0.0.1:{config.trainer.metrics_port}"),
    ]
    return found + [Target(f"sampler-{i}", "sampler", f"127.0.0.1:{port}") for i, port in enumerate(sampler_ports)]


def start_prometheus(cluster: Cluster, directory: Path, scrape: list[Target]) -> str:
    """A Prometheus child scraping ``scrape`` with the rules of :mod:`nibble.monitoring.rules`; returns
    its URL once it is ready.

    Raises:
        RuntimeError: it exited or was not ready within 30 s (see ``logs/prometheus.log``).
    """
    config = local_prometheus.write_config(directory, scrape)
    port = free_port()
    child = cluster.start("prometheus", local_prometheus.argv(config, directory / "data", port))
    url = f"http://127.0.0.1:{port}"
    try:
        local_prometheus.wait_ready(url, 30, alive=lambda: child.process.poll() is None)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; see {child.log}") from None
    return url


def check_devices(config: RunConfig) -> None:
    """Refuse, before anything starts, a trainer or samplers on GPUs this machine does not have.

    Raises:
        ValueError: naming the settings and the GPUs visible.
    """
    t, s = config.trainer, config.sampler
    if t.device == "cpu" and s.device == "cpu":
        return
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if t.device != "cpu" and visible < t.nproc_per_node:
        raise ValueError(
            f"trainer.device={t.device} with trainer.nproc_per_node={t.nproc_per_node} needs that many GPUs; "
            f"{visible} visible"
        )
    for key, device in (("trainer.device", t.device), ("sampler.device", s.device)):
        index = devices.gpu_index(device)
        if index is not None and index >= visible:
            raise ValueError(f"{key}={device} but this machine has {visible} GPU(s) visible")


def check_model_and_task(config: RunConfig) -> None:
    """Refuse, before a warm start is trained or anything starts: task options the task rejects, a missing
    ``model.checkpoint`` that ``nibble sft`` cannot make (it trains the tiny built-in model, for tasks with
    their own character vocabulary), and a quantised plan that quantises no layer of the model.

    Raises:
        ValueError: naming the setting.
    """
    from nibble.model import load_config
    from nibble.tasks import CharTokenizer, get_task

    try:
        with get_task(config.task.name, **config.task.options) as task:
            own_vocabulary = isinstance(task.tokenizer, CharTokenizer)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"task {config.task.name!r}: {exc}") from None
    checkpoint = config.model.checkpoint
    if not (checkpoint / "config.json").is_file():
        if checkpoint.is_file() or checkpoint.suffix == ".gguf":
            raise ValueError(
                f"model.checkpoint={checkpoint} is a file, not a checkpoint directory; convert it with "
                "nibble import-model FILE --out DIR and point model.checkpoint at DIR"
            )
        if not own_vocabulary:
            raise ValueError(
                f"model.checkpoint={checkpoint} holds no checkpoint, and task {config.task.name!r} uses a "
                "pretrained model's tokenizer, so no warm start can be trained for it: import the model "
                "with nibble import-model"
            )
        return
    model = load_config(checkpoint)
    if config.plan.format != "bf16" and config.plan.quantize == "experts" and not model.is_moe:
        raise ValueError(
            f"plan.quantize=experts quantises nothing of {checkpoint}, a dense {model.architecture} model: "
            f"use plan.quantize: all_linear for {config.plan.format} rollouts (or plan.format: bf16)"
        )


def _interrupt(signum, _frame) -> None:
    raise Interrupted(signum)
