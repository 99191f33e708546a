"""Live samplers: heartbeats in Redis counted by the trainer, silent samplers aging out, clean leaves."""

import time

import pytest

from nibble.config import RedisConfig
from nibble.transport.stream import connect
from nibble.transport.stream.presence import SamplerRegistry
from tests.services import redis_config


def test_samplers_count_while_they_beat_and_age_out_when_silent(redis_server):
    timeout = 2.0
    config = redis_config(redis_server.url, sampler_heartbeat_seconds=0.2, sampler_timeout_seconds=timeout)
    client = connect(config)
    trainer, sampler = SamplerRegistry(client, config), SamplerRegistry(client, config)
    assert trainer.live() == 0
    silent_since = time.monotonic()  # at most b's last beat
    for name in ("sampler-a", "sampler-b", "sampler-c"):
        sampler.beat(name)
    sampler.beat("sampler-a")  # a repeated beat is still one sampler
    assert trainer.live() == 3
    sampler.leave("sampler-c")
    assert trainer.live() == 2
    while trainer.live() == 2:  # a keeps beating, b falls silent
        assert time.monotonic() - silent_since < timeout + 30, "a silent sampler never aged out"
        sampler.beat("sampler-a")
        time.sleep(0.1)
    assert time.monotonic() - silent_since >= timeout, "a sampler aged out before its timeout"
    assert trainer.live() == 1
    assert client.zrange(trainer.key, 0, -1) == [b"sampler-a"]  # the silent one is forgotten, not just skipped
    client.close()


def test_timeout_must_exceed_heartbeat():
    with pytest.raises(ValueError, match=r"sampler_timeout_seconds=5\.0 must exceed"):
        RedisConfig(sampler_heartbeat_seconds=5.0, sampler_timeout_seconds=5.0)
