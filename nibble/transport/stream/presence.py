"""Which samplers are alive: each sampler beats a heartbeat into Redis, the trainer counts the recent ones.

The trainer's ``nibble_sampler_demand`` scales from the samplers actually running, not from a count in
the run config, so scaling samplers (``kubectl scale``, ``docker compose up --scale``) changes nothing the
trainer or weight-sync read. One sorted set (``<key_prefix>samplers``) maps sampler id → the Redis
server's time of its last beat, so clocks of different machines never meet.
"""

from __future__ import annotations

import redis

from nibble.config import RedisConfig
from nibble.transport.stream.connection import retrying

# KEYS[1] = the set, ARGV[1] = sampler id: record the server's time (seconds) as the id's last beat.
_BEAT = """
local now = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(now[1]) + tonumber(now[2]) / 1e6, ARGV[1])
return 1
"""
# KEYS[1] = the set, ARGV[1] = window (s): forget ids silent for longer than the window, count the rest.
_LIVE = """
local now = redis.call('TIME')
local cutoff = tonumber(now[1]) + tonumber(now[2]) / 1e6 - tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff)
return redis.call('ZCARD', KEYS[1])
"""


class SamplerRegistry:
    """Sampler heartbeats in Redis (entries: sampler ids; scores: seconds, Redis server time).

    Args:
        client: a connected client (``nibble.transport.stream.connect``).
        config: the ``redis`` section; ``sampler_heartbeat_seconds`` and ``sampler_timeout_seconds`` set
            how often samplers beat and after how long a silent one no longer counts.
    """

    def __init__(self, client: redis.Redis, config: RedisConfig):
        self.client, self.config = client, config
        self.key = f"{config.key_prefix}samplers"
        self._beat = client.register_script(_BEAT)
        self._live = client.register_script(_LIVE)

    def beat(self, sampler_id: str) -> None:
        """Record that ``sampler_id`` is alive now."""
        retrying(self.client, self.config, "sending a sampler heartbeat", lambda: self._beat([self.key], [sampler_id]))

    def leave(self, sampler_id: str) -> None:
        """Remove ``sampler_id`` at once (a clean shutdown), instead of after the timeout."""
        retrying(
            self.client, self.config, "removing a sampler heartbeat", lambda: self.client.zrem(self.key, sampler_id)
        )

    def live(self) -> int:
        """Samplers whose last beat is at most ``sampler_timeout_seconds`` old (older ones are forgotten)."""
        window = self.config.sampler_timeout_seconds
        return int(
            retrying(self.client, self.config, "counting live samplers", lambda: self._live([self.key], [window]))
        )
