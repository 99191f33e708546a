"""A slot held by anything that will never write comes back without a person: a sampler killed mid-batch
(its lease runs out), an engine error (given back at once; the sampler exits after bounded retries), a
group the stream refuses (README "Failure semantics")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nibble.sampler.engine import Engine, Sample
from nibble.sampler.service import EngineFailed
from nibble.transport.stream import connect
from tests.reliability.conftest import make_sampler, sampler_config

# A sampler process whose engine hangs in generate (a stuck GPU, a dead remote engine): it reserves its
# batch's 4 slots and keeps its lease alive until it is killed.
HANGING_SAMPLER = textwrap.dedent(
    """
    import json, sys, threading
    from nibble.config import RunConfig
    from nibble.sampler.engine import Engine, Sample
    from tests.reliability.conftest import make_sampler

    class Hanging(Engine):
        policy_version = 0
        def generate(self, prompts, **kwargs):
            print("generating", flush=True)
            threading.Event().wait()
        def pause(self): pass
        def resume(self): pass
        def update_weights(self, version, state): pass

    make_sampler(RunConfig.model_validate(json.loads(sys.argv[1])), Hanging(), name="doomed").run()
    """
)


class Failing(Engine):
    """An engine whose every generate raises (as a CUDA error or a dead external engine would)."""

    policy_version = 0

    def generate(self, prompts, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def pause(self):
        pass

    def resume(self):
        pass

    def update_weights(self, version, state):
        pass


def stream_length(config) -> int:
    return connect(config.redis).xlen(config.redis.stream)


def test_slots_of_a_killed_sampler_come_back_after_its_lease(stream_config):
    # the doomed sampler renews every lease/3 s while this process generates on both cores: a 3 s lease
    # leaves a renewal 2 s of scheduling delay before the healthy sampler could take its slots
    config = sampler_config(stream_config, admission_lease_seconds=3.0)
    doomed = subprocess.Popen(
        [sys.executable, "-c", HANGING_SAMPLER, json.dumps(config.model_dump(mode="json"))],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
    )  # fmt: skip
    try:
        assert doomed.stdout.readline().strip() == "generating"
        healthy = make_sampler(config)
        assert healthy.admission.started() == 4
        time.sleep(2 * config.redis.admission_lease_seconds)  # alive: its lease is renewed, its slots kept
        assert healthy.step() and stream_length(config) == 4  # the other 4 of the version's 8
        assert not healthy.step()  # admission is full: 4 written + 4 held by the hanging sampler
    finally:
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait()
    # dead: nobody renews its lease; once it has run out the next reservation takes its slots back
    time.sleep(config.redis.admission_lease_seconds + 0.2)
    assert healthy.step()
    assert stream_length(config) == 8  # the trainer gets its 8 groups for the version
    assert healthy.admission.started() == 8 and healthy.admission.held("doomed") == 0


def test_engine_errors_give_slots_back_and_the_sampler_exits_after_bounded_retries(stream_config):
    config = sampler_config(stream_config)
    broken = make_sampler(config, Failing())
    assert broken.step()  # the first failure: logged, counted, slots given back at once
    assert broken.admission.started() == 0 and broken.stats.engine_failures == 1
    with pytest.raises(EngineFailed, match="failed 2 batches in a row; last error: RuntimeError: CUDA error"):
        broken.step()
    assert broken.admission.started() == 0 and stream_length(config) == 0
    healthy = make_sampler(config)
    assert healthy.step() and healthy.step() and stream_length(config) == 8


class Inconsistent(Failing):
    """An engine with a bug: every response has one logprob more than it has tokens."""

    def generate(self, prompts, *, n, **kwargs):
        return [[Sample(tokens=[4, 5], logprobs=[-1.0, -1.0, -1.0], finish_reason="stop")] * n for _ in prompts]


def test_groups_the_stream_refuses_give_their_slots_back(stream_config):
    config = sampler_config(stream_config)
    sampler = make_sampler(config, Inconsistent())
    assert sampler.step()
    assert stream_length(config) == 0 and sampler.admission.started() == 0
    assert sampler.metrics.value("nibble_rejected_total", reason="refused_group") == 4
    assert sampler.stats.groups_not_written == 4
