"""Atomic weight versions across faults: a sampler whose fetch fails keeps serving its version and retries;
a trainer resumed after a crash never publishes a version number again with other weights."""

from __future__ import annotations

import threading
import time

import torch

from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state
from nibble.trainer.main import highest_published
from tests.reliability.conftest import InProcessTrainer, make_sampler, run_config, sampler_config, tiny_engine
from tests.weightsync.conftest import Harness


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_failed_fetch_keeps_the_version_and_is_retried(stream_config, tmp_path):
    config = sampler_config(stream_config)
    harness = Harness(tmp_path / "store")
    try:
        server = harness.start()
        ports = {"port": server.port, "publish_port": server.publish_port}
        trainer = tiny_engine(15).model  # any model of the sampler's layout
        plan = PrecisionPlan(num_layers=trainer.config.num_hidden_layers, format="bf16")
        harness.publisher(server).publish(1, published_state(trainer), plan)
        subscriber = harness.subscriber(server, attempts=1)
        sampler = make_sampler(config, tiny_engine(15), subscriber=subscriber)
        threading.Thread(target=sampler.watch_versions, daemon=True).start()
        wait_for(lambda: sampler._pending_version is not None, "the announcement of version 1")

        server.stop(0)  # weight-sync gone between the announcement and the fetch
        sampler.maybe_update_weights()
        assert sampler.engine.policy_version == 0  # still serving version 0
        assert sampler.metrics.value("nibble_rejected_total", reason="fetch_failed") == 1
        assert sampler.metrics.value("nibble_rejected_total", reason="bad_manifest") == 0
        assert sampler.step()  # and generating with it

        harness.start(**ports)  # back, on the same ports and store
        wait_for(lambda: (sampler.maybe_update_weights(), sampler.engine.policy_version)[1] == 1, "the retry")
    finally:
        harness.close()


def test_a_resumed_trainer_continues_above_versions_published_from_lost_steps(stream_config, tmp_path):
    config = run_config(stream_config, tmp_path)
    harness = Harness(tmp_path / "store")
    try:
        server = harness.start()
        first = InProcessTrainer(config, tmp_path / "out", publisher=harness.publisher(server))
        first.trainer.checkpoint()  # step 0, version 0
        with torch.no_grad():  # steps the crash loses (never checkpointed) train the weights on
            for param in first.trainer.model.parameters():
                param.add_(0.1)
        first.trainer.publish()  # and publish them as versions 1 and 2
        first.trainer.publish()
        lost = published_state(first.trainer.model)

        resumed = InProcessTrainer(config, tmp_path / "out", publisher=harness.publisher(server))
        assert resumed.trainer.state.policy_version == 0  # the checkpoint's
        resumed.trainer.continue_above(highest_published(resumed.trainer.publisher, resumed.admission))
        assert resumed.trainer.state.policy_version == 3  # its own weights, under a number never used
        assert list(harness.publisher(server).versions().available_versions) == [1, 2, 3]
        assert resumed.admission.trainer_version() == 3
        _, version_3 = harness.subscriber(server).fetch(3)
        mine = published_state(resumed.trainer.model)
        assert all(torch.equal(version_3[name], mine[name]) for name in mine)
        assert not all(torch.equal(lost[name], mine[name]) for name in mine)

        # weight-sync lost its store as well: Redis's trainer version still keeps the numbers unique
        server.stop(0)
        fresh = Harness(tmp_path / "empty-store")
        try:
            empty = fresh.start()
            again = InProcessTrainer(config, tmp_path / "out", publisher=fresh.publisher(empty))
            again.trainer.continue_above(highest_published(again.trainer.publisher, again.admission))
            assert again.trainer.state.policy_version == 4
            assert list(fresh.publisher(empty).versions().available_versions) == [4]
        finally:
            fresh.close()
    finally:
        harness.close()
