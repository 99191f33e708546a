"""Admission control: the started-groups counter never passes ``allowed`` under concurrent samplers;
slots come back; the trainer version only grows."""

import threading

import pytest

from nibble.config.admission import allowed_groups
from nibble.transport.stream import AdmissionCounter, connect


def test_concurrent_reservers_never_exceed_allowed_and_release_reopens_slots(stream_config):
    client = connect(stream_config)
    counter = AdmissionCounter(client, stream_config)
    taken, barrier = [], threading.Barrier(8)

    def sampler():
        barrier.wait()
        taken.append(sum(counter.reserve(allowed=25, holder="s") for _ in range(10)))

    threads = [threading.Thread(target=sampler) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken) == 25 and counter.started() == 25
    assert not counter.reserve(25, "s")
    counter.release(3)
    assert counter.started() == 22
    assert [counter.reserve(25, "s") for _ in range(4)] == [True, True, True, False]
    assert counter.reserve(26, "s")  # a new version raises the allowance
    counter.release(100)  # more than started: clamped, never negative
    assert counter.started() == 0
    with pytest.raises(ValueError, match="-1 slots"):
        counter.release(-1)
    client.close()


def test_trainer_version_is_shared_and_only_grows(stream_config):
    client = connect(stream_config)
    trainer, sampler = AdmissionCounter(client, stream_config), AdmissionCounter(client, stream_config)
    assert sampler.trainer_version() == 0
    trainer.set_trainer_version(3)
    trainer.set_trainer_version(3)
    assert sampler.trainer_version() == 3
    with pytest.raises(ValueError, match="2 is below the published trainer version 3"):
        trainer.set_trainer_version(2)
    assert allowed_groups(sampler.trainer_version(), max_staleness=2, groups_per_version=4) == 24
    assert allowed_groups(0, max_staleness=0, groups_per_version=4) == 4  # synchronous: one batch per version
    with pytest.raises(ValueError, match="groups_per_version=0"):
        allowed_groups(0, 0, 0)
    client.close()
