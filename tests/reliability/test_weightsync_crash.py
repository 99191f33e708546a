"""``kill -9`` of weight-sync in the middle of a publication: after a restart on the same store the partial
version is neither held nor announced, the versions before it still verify, and the trainer's retry of the
same version number goes through (it was never published)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import grpc
import pytest
import yaml

from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state
from nibble.transport.weights import GrpcWeightPublisher, GrpcWeightSubscriber, VersionUnavailable, stream_items
from nibble.transport.weights.grpc_util import open_channel
from nibble.wire import rpc
from tests.services import free_port


def start(config_file) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "nibble.weightsync", "--config", str(config_file)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdout.readline().startswith("READY"), "weight-sync did not start"
    return process


def test_kill_9_mid_publication_leaves_no_partial_version(tmp_path):
    ports = {"port": free_port(), "publish_port": free_port()}
    config_file = tmp_path / "run.yaml"
    settings = {**ports, "host": "127.0.0.1", "store_dir": str(tmp_path / "store"), "chunk_bytes": 4096}
    config_file.write_text(yaml.safe_dump({"weightsync": settings}))
    model = MoETransformer(tiny(vocab_size=16), PrecisionPlan(num_layers=4, format="bf16"))
    state, plan = published_state(model), model.plan
    server = start(config_file)
    publish_target, fetch_target = f"127.0.0.1:{ports['publish_port']}", f"127.0.0.1:{ports['port']}"
    try:
        GrpcWeightPublisher(publish_target, attempts=1).publish(1, state, plan)
        # version 2: the manifest and half the chunks, then the process is killed while the stream is open
        items = list(stream_items(2, state, plan.model_dump_json(), chunk_bytes=4096))
        half, sent, killed = len(items) // 2, threading.Event(), threading.Event()

        def partial():
            yield from items[:half]
            sent.set()
            killed.wait(30)  # the stream stays open until the server is dead

        outcome = {}

        def publish():
            with open_channel(publish_target) as channel:
                try:
                    rpc.WeightPublisherStub(channel).PublishWeights(partial(), timeout=60)
                except grpc.RpcError as exc:
                    outcome["code"] = exc.code()

        sender = threading.Thread(target=publish, daemon=True)
        sender.start()
        assert sent.wait(30)
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        killed.set()
        sender.join(timeout=30)
        assert outcome["code"] == grpc.StatusCode.UNAVAILABLE  # the trainer sees the publication fail

        server = start(config_file)  # restarted on the same store (a Deployment's new pod)
        subscriber = GrpcWeightSubscriber(fetch_target, attempts=1)
        assert subscriber.versions().latest_version == 1
        assert list(subscriber.versions().available_versions) == [1]
        manifest, _ = subscriber.fetch(1)  # still verifies
        assert manifest.policy_version == 1
        with pytest.raises(VersionUnavailable, match="version 2") as info:
            subscriber.fetch(2)
        assert info.value.__cause__.code() == grpc.StatusCode.NOT_FOUND
        assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".tmp-")]
        GrpcWeightPublisher(publish_target, attempts=1).publish(2, state, plan)  # the trainer's retry
        announced = next(iter(subscriber.watch(after_version=1)))
        assert announced.policy_version == 2
        subscriber.close()
    finally:
        server.kill()
        server.wait()
