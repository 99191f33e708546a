"""Exact accounting across crashes: ``kill -9`` of a sampler and of the trainer (then resumed), and a
duplicated XADD.

Every ``trajectory_id`` written to the stream (read back from Redis's append-only file, which keeps
every XADD even after trimming) is trained exactly once in the persisted lineage, or dropped as stale,
or still waits in the stream — and policy versions never repeat after the resume.
"""

import json
import os
import signal
import time
from pathlib import Path

import yaml

from nibble.config import load
from nibble.launcher import Cluster, child_environment, free_port
from nibble.trainer import checkpoint
from nibble.wire import pb
from tests.launcher.stack import ROOT, aof_commands, wait_for_step
from tests.services import RedisServer


def written_ids(redis_dir: Path, stream: str) -> list[str]:
    ids = []
    for command in aof_commands(redis_dir):
        if command[0].upper() == b"XADD" and command[1].decode() == stream:
            group = pb.TrajectoryGroup.FromString(command[command.index(b"group") + 1])
            ids += [r.trajectory_id for r in group.responses]
    return ids


def test_kill_9_of_a_sampler_and_of_the_trainer_loses_and_duplicates_nothing(warm_start, tmp_path):
    redis = RedisServer(tmp_path / "redis", "--appendonly", "yes", "--appendfsync", "always").start()
    out = tmp_path / "run"
    base = load(ROOT / "configs" / "smoke.yaml").model_dump(mode="json")
    base["model"]["checkpoint"] = str(warm_start)
    base["redis"]["url"] = redis.url
    base["weightsync"].update(port=free_port(), publish_port=free_port(), store_dir=str(out / "weights"))
    base["trainer"].update(total_steps=14, checkpoint_dir=str(out / "trainer"), eval_every=100)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(base))
    config = load(config_path)
    cluster = Cluster(out, env=child_environment())
    try:
        cluster.start_service("weightsync", "nibble.weightsync", config_path)
        trainer = cluster.start_service("trainer", "nibble.trainer", config_path, "--out", str(out))
        samplers = [
            cluster.start_service(
                f"sampler-{i}", "nibble.sampler", config_path, "--name", f"sampler-{i}", "--out", str(out)
            )
            for i in range(2)
        ]
        wait_for_step(out, 1)
        client = redis.client()
        deadline = time.monotonic() + 120
        while not (entries := client.xrange(config.redis.stream, count=1)):  # the trainer may have just trimmed
            assert time.monotonic() < deadline, "no group reached the stream in 120 s"
            time.sleep(0.1)
        _, fields = entries[0]
        client.xadd(config.redis.stream, {b"group": fields[b"group"]})  # a duplicate XADD (a retried write)
        duplicated = len(pb.TrajectoryGroup.FromString(fields[b"group"]).responses)
        wait_for_step(out, 3)
        os.kill(samplers[0].process.pid, signal.SIGKILL)
        cluster.start_service("sampler-2", "nibble.sampler", config_path, "--name", "sampler-2", "--out", str(out))
        wait_for_step(out, 6)
        os.kill(trainer.process.pid, signal.SIGKILL)
        trainer.process.wait()
        resumed = cluster.start_service("trainer-resumed", "nibble.trainer", config_path, "--out", str(out))
        assert resumed.process.wait(timeout=400) == 0, resumed.log.read_text()[-3000:]
    finally:
        cluster.stop()
    remaining = [
        r.trajectory_id
        for _, fields in client.xrange(config.redis.stream)
        for r in pb.TrajectoryGroup.FromString(fields[b"group"]).responses
    ]
    redis.stop()
    written = written_ids(tmp_path / "redis", config.redis.stream)
    state = checkpoint.load_state(checkpoint.latest(out / "trainer"))
    trained, dropped = state.trained, state.stale_dropped
    assert state.step == 14
    assert len(written) == len(set(written)) + duplicated, "only the test's own duplicate XADD repeats ids"
    assert len(trained) == len(set(trained)) and not set(trained) & set(dropped)
    assert set(trained) | set(dropped) <= set(written)
    assert set(written) <= set(trained) | set(dropped) | set(remaining), "a written trajectory was lost"
    # the persisted lineage: for each step, the last line written (steps redone after the crash replace
    # the lost ones) — its trajectories add up to the ledger exactly, so nothing was trained twice
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    lineage = {x["step"]: x for x in lines if x["step"] > 0}
    assert sum(x["trained_trajectories"] for x in lineage.values()) == len(trained)
    versions = [lineage[s]["policy_version"] for s in sorted(lineage)]
    assert versions == sorted(set(versions)), "policy versions repeated after the resume"
    print(f"written {len(written)}, trained {len(trained)}, dropped {len(dropped)}, waiting {len(remaining)}")
