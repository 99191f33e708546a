"""The launcher's stop with real child processes: stages in reverse start order, each given its grace
period, a stage that will not stop killed, and a second Ctrl-C killing what is left at once. Its ports:
chosen where no outgoing connection takes its local port, never one in use, never twice."""

import os
import signal
import socket
import sys
import threading
import time

import pytest

from nibble import launcher
from nibble.launcher import Cluster

# A child that notes its SIGTERM (to the file named by argv[1]) and exits after argv[2] seconds, or never.
CHILD = """
import signal, sys, time
def term(*_):
    open(sys.argv[1], "a").write(f"{time.monotonic()}\\n")
    if sys.argv[2] != "never":
        time.sleep(float(sys.argv[2]))
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
open(sys.argv[1] + ".up", "w").close()
while True:
    time.sleep(0.05)
"""


def start(cluster: Cluster, tmp_path, name: str, linger: str, stage: str = ""):
    child = cluster.start(name, [sys.executable, "-c", CHILD, str(tmp_path / name), linger], stage)
    while not (tmp_path / f"{name}.up").exists():
        time.sleep(0.02)
    return child


def termed_at(tmp_path, name: str) -> float:
    return float((tmp_path / name).read_text().split()[0])


def test_stages_stop_in_reverse_start_order_one_after_the_other(tmp_path):
    cluster = Cluster(tmp_path)
    for name, linger, stage in [("redis", "0", ""), ("trainer", "0.3", ""), ("sampler-0", "0.3", "samplers"),
                                ("sampler-1", "0.1", "samplers")]:  # fmt: skip
        start(cluster, tmp_path, name, linger, stage)
    said = []
    cluster.stop(said.append)
    assert [line.split(" in ")[0] for line in said] == [
        "stopping samplers (sampler-0, sampler-1)", "stopped samplers",
        "stopping trainer", "stopped trainer", "stopping redis", "stopped redis",
    ]  # fmt: skip
    samplers = min(termed_at(tmp_path, "sampler-0"), termed_at(tmp_path, "sampler-1"))
    assert samplers + 0.3 <= termed_at(tmp_path, "trainer")  # the trainer waited for the slower sampler
    assert termed_at(tmp_path, "trainer") + 0.3 <= termed_at(tmp_path, "redis")
    assert all(c.process.returncode == 0 for c in cluster.children)


def test_a_stage_past_its_grace_is_killed_and_a_second_ctrl_c_kills_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "STOP_GRACE_BY_STAGE", {"stubborn": 0.5})
    monkeypatch.setattr(launcher, "STOP_GRACE_SECONDS", 60.0)
    cluster = Cluster(tmp_path)
    start(cluster, tmp_path, "last", "never")
    start(cluster, tmp_path, "patient", "never")
    start(cluster, tmp_path, "stubborn", "never")
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()  # the user presses Ctrl-C again
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the tests run as a background job
    said = []
    started = time.monotonic()
    cluster.stop(said.append)
    assert time.monotonic() - started < 10  # not the 60 s grace of "patient"
    assert said[1].startswith("stopped stubborn in 0.") and said[1].endswith("(killed stubborn)")
    assert said[3].endswith("(killed patient)") and said[5].endswith("(killed last)")
    assert [c.process.returncode for c in cluster.children] == [-signal.SIGKILL] * 3
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_directories_a_run_keeps_in_its_folder_are_named_when_the_config_sets_others(tmp_path):
    from nibble.config import load

    config = load(None)
    assert launcher.replaced_directories(config, tmp_path) == []
    mine = config.model_copy(
        update={
            "trainer": config.trainer.model_copy(update={"checkpoint_dir": tmp_path / "mine"}),
            "weightsync": config.weightsync.model_copy(update={"store_dir": tmp_path / "w"}),
        }
    )
    assert launcher.replaced_directories(mine, tmp_path / "run") == [
        f"trainer.checkpoint_dir = {tmp_path / 'mine'} is replaced by the run folder's {tmp_path / 'run' / 'trainer'}",
        f"weightsync.store_dir = {tmp_path / 'w'} is replaced by the run folder's {tmp_path / 'run' / 'weights'}",
    ]
    effective = launcher.effective_config(mine, tmp_path / "run", "redis://127.0.0.1:1/0")
    assert effective.trainer.checkpoint_dir == tmp_path / "run" / "trainer"
    assert effective.weightsync.store_dir == tmp_path / "run" / "weights"


def test_a_config_the_run_folder_would_make_invalid_is_refused_naming_the_fields(tmp_path):
    from nibble.config import load

    config = load(None)
    clash = config.model_copy(
        update={"weightsync": config.weightsync.model_copy(update={"export_dir": tmp_path / "run" / "weights"})}
    )
    with pytest.raises(ValueError, match=r"run folder's directories \(.*weightsync\.store_dir = .*export_dir must"):
        launcher.effective_config(clash, tmp_path / "run", config.redis.url)


def ephemeral_range() -> range:
    low, high = map(int, launcher.EPHEMERAL_RANGE_FILE.read_text().split())
    return range(low, high + 1)


class Draws:
    """Stands in for ``launcher._rng``: its choices are ``ports``, in order."""

    def __init__(self, *ports: int):
        self.ports = iter(ports)

    def choice(self, _candidates) -> int:
        return next(self.ports)


outside_ephemeral = pytest.mark.skipif(
    not launcher._ports_outside_ephemeral(),
    reason="needs ports outside the kernel's ephemeral port range (Linux's ip_local_port_range) to draw from",
)


@outside_ephemeral
def test_ports_for_servers_lie_outside_the_range_outgoing_connections_take_theirs_from_and_never_repeat():
    ports = [launcher.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(p >= launcher.LOWEST_CHOSEN_PORT and p not in ephemeral_range() for p in ports), ports
    with socket.socket() as server:  # each one a server can bind
        server.bind(("127.0.0.1", ports[0]))
        server.listen()
        with socket.create_connection(("127.0.0.1", ports[0])) as client:  # the kernel's choice, for contrast
            assert client.getsockname()[1] in ephemeral_range()


@outside_ephemeral
def test_a_port_in_use_or_handed_out_before_is_passed_over(monkeypatch):
    handed_out = launcher.free_port()
    outside = reversed(launcher._ports_outside_ephemeral())
    spare = next(p for p in outside if p not in launcher._handed_out and launcher._binds(p))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        monkeypatch.setattr(launcher, "_rng", Draws(taken.getsockname()[1], handed_out, spare))
        assert launcher.free_port() == spare


def test_a_range_that_starts_below_the_lowest_chosen_port_leaves_the_ports_above_its_top(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", tmp_path / "ip_local_port_range")
    launcher.EPHEMERAL_RANGE_FILE.write_text("1024\t64999\n")
    assert launcher._ports_outside_ephemeral() == list(range(65000, 65536))
    assert 65000 <= launcher.free_port() <= 65535
    launcher.EPHEMERAL_RANGE_FILE.write_text("32768\t60999\n")  # the usual: both sides
    assert launcher._ports_outside_ephemeral() == [*range(launcher.LOWEST_CHOSEN_PORT, 32768), *range(61000, 65536)]


@pytest.mark.skipif(not launcher.EPHEMERAL_RANGE_FILE.is_file(), reason="needs Linux's ephemeral port range")
@pytest.mark.parametrize("content", [None, "1024\t65535\n"], ids=["unreadable", "covering-all-ports"])
def test_without_ports_outside_the_ephemeral_range_the_kernel_chooses_and_never_repeats(content, tmp_path, monkeypatch):
    kernels = ephemeral_range()  # the real one, read before the file is replaced
    if content is not None:
        (tmp_path / "ip_local_port_range").write_text(content)
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", tmp_path / "ip_local_port_range")
    ports = [launcher.free_port() for _ in range(20)]  # 20: a fallback drawing anywhere else would miss
    assert all(p in kernels and p in launcher._handed_out for p in ports), ports  # bind(0)'s, recorded
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[0]))
    fresh = next(p for p in kernels if p not in launcher._handed_out)
    choices = iter([ports[0], fresh])  # the kernel repeating a port handed out before is asked again
    monkeypatch.setattr(launcher, "_kernel_port", lambda: next(choices))
    assert launcher.free_port() == fresh
