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
    import pytest

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


@pytest.mark.skipif(not launcher.EPHEMERAL_RANGE_FILE.is_file(), reason="needs Linux's ephemeral port range")
def test_ports_for_servers_lie_below_the_range_outgoing_connections_take_theirs_from_and_never_repeat():
    ports = [launcher.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(launcher.LOWEST_CHOSEN_PORT <= p < ephemeral_range().start for p in ports), ports
    with socket.socket() as server:  # each one a server can bind
        server.bind(("127.0.0.1", ports[0]))
        server.listen()
        with socket.create_connection(("127.0.0.1", ports[0])) as client:  # the kernel's choice, for contrast
            assert client.getsockname()[1] in ephemeral_range()


@pytest.mark.skipif(not launcher.EPHEMERAL_RANGE_FILE.is_file(), reason="needs Linux's ephemeral port range")
def test_a_port_in_use_or_handed_out_before_is_passed_over(monkeypatch):
    handed_out = launcher.free_port()
    below = reversed(launcher._ports_below_ephemeral())
    spare = next(p for p in below if p not in launcher._handed_out and launcher._binds(p))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        draws = iter([taken.getsockname()[1], handed_out, spare])
        monkeypatch.setattr(launcher.random, "choice", lambda ports: next(draws))
        assert launcher.free_port() == spare


def test_without_a_readable_ephemeral_range_the_kernel_chooses(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", tmp_path / "absent")
    port = launcher.free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
