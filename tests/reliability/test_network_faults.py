"""Faults with exact accounting: a sampler and a trainer run against a real Redis (AOF on) while the
sampler's connection is cut for 3 s (a proxy in front of the port) and Redis restarts. Every trajectory
written is trained once or still queued; none is lost or trained twice; versions never repeat."""

from __future__ import annotations

import json
import threading
import time

from nibble.transport.stream import AdmissionCounter, RedisTrajectoryWriter, connect
from tests.reliability.conftest import InProcessTrainer, make_sampler, run_config
from tests.reliability.proxy import Proxy
from tests.services import RedisServer, redis_config


class RecordingWriter(RedisTrajectoryWriter):
    """The sampler's writer, remembering every trajectory id it wrote (the test's ground truth)."""

    written: list[str]

    def write(self, group, also=None):
        entry_id = super().write(group, also)
        self.written.extend(r.trajectory_id for r in group.responses)
        return entry_id


def queued_trajectories(client, config) -> list[str]:
    """Trajectory ids of entries not yet acknowledged: pending, or never delivered."""
    from nibble.wire import pb

    [group] = [g for g in client.xinfo_groups(config.stream) if g["name"].decode() == config.consumer_group]
    pending = {p["message_id"] for p in client.xpending_range(config.stream, config.consumer_group, "-", "+", 10**6)}
    last = tuple(map(int, group["last-delivered-id"].decode().split("-")))
    out = []
    for entry_id, fields in client.xrange(config.stream):
        if entry_id in pending or tuple(map(int, entry_id.decode().split("-"))) > last:
            out.extend(r.trajectory_id for r in pb.TrajectoryGroup.FromString(fields[b"group"]).responses)
    return out


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_cut_connection_and_redis_restart_lose_and_repeat_nothing(tmp_path):
    server = RedisServer(tmp_path / "redis", "--appendonly", "yes").start()
    try:
        direct = redis_config(server.url, retry_seconds=30.0)
        config = run_config(direct, tmp_path, groups_per_step=2, total_steps=6, max_staleness=100)
        service = InProcessTrainer(config, tmp_path / "out")
        with Proxy(server.port) as proxy:
            through_proxy = direct.model_copy(update={"url": f"redis://127.0.0.1:{proxy.port}/0"})
            sampler = make_sampler(config.model_copy(update={"redis": through_proxy}))
            sampler.writer.__class__ = RecordingWriter
            sampler.writer.written = []
            threads = [
                threading.Thread(target=service.trainer.run, daemon=True),
                threading.Thread(target=sampler.run, daemon=True),
            ]
            for thread in threads:
                thread.start()
            wait_for(lambda: service.trainer.state.step >= 1, "the first step")
            proxy.cut()  # the sampler's network is gone for 3 s
            time.sleep(3)
            proxy.restore()
            wait_for(lambda: service.trainer.state.step >= 3, "step 3")
            server.stop()  # Redis restarts (its append-only file brings the data back)
            time.sleep(1)
            server.start()
            threads[0].join(timeout=180)
            assert not threads[0].is_alive(), "the trainer did not finish"
            sampler.stop.set()
            threads[1].join(timeout=60)
        client = connect(direct)
        trained = service.trainer.ledger.ids()
        queued = queued_trajectories(client, direct)
        written = sampler.writer.written
        assert len(trained) == len(set(trained)) == 6 * 2 * 2  # 6 steps of 2 groups of 2, none twice
        assert set(trained).isdisjoint(queued)
        assert set(written) == set(trained) | set(queued)  # nothing lost, nothing invented
        assert sum(service.trainer.reader.dead_lettered.values()) == 0 and service.trainer.stale_dropped_total == 0
        versions = [
            json.loads(line)["policy_version"]
            for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
            if "policy_version" in line
        ]
        assert versions == sorted(set(versions)), versions  # strictly increasing: no version repeated
        assert AdmissionCounter(client, direct).held(sampler.sampler_id) == 0  # no reservation left behind
    finally:
        server.stop()
