"""Admission control (AReaL's rule, DESIGN.md §5): samplers start a group only while the groups started
stay ≤ ``(v + max_staleness + 1) × groups_per_version``, ``v`` being the trainer's current policy version.

Both numbers live in Redis (keys under ``RedisConfig.key_prefix``), so every sampler and the trainer see
the same ones, across restarts of any of them.
"""

from __future__ import annotations

import logging

import redis

from nibble.config import RedisConfig
from nibble.transport.connection import retrying

logger = logging.getLogger(__name__)

# KEYS[1] = started counter, ARGV[1] = allowed: count one more start only while the total stays ≤ allowed.
_RESERVE = """
local started = tonumber(redis.call('GET', KEYS[1]) or '0')
if started + 1 > tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
return 1
"""
# KEYS[1] = started counter, ARGV[1] = n: give n slots back, never going below 0; returns the unclamped value.
_RELEASE = """
local started = redis.call('DECRBY', KEYS[1], ARGV[1])
if started < 0 then redis.call('SET', KEYS[1], 0) end
return started
"""
# KEYS[1] = version key, ARGV[1] = v: store v unless a larger version is stored; returns what is stored.
_SET_VERSION = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) < current then return current end
redis.call('SET', KEYS[1], ARGV[1])
return tonumber(ARGV[1])
"""


def allowed_groups(trainer_version: int, max_staleness: int, groups_per_version: int) -> int:
    """``(trainer_version + max_staleness + 1) × groups_per_version``: the most groups that may have been
    started while the trainer holds ``trainer_version``.

    Raises:
        ValueError: a negative version or staleness, or fewer than one group per version.
    """
    if trainer_version < 0 or max_staleness < 0:
        raise ValueError(f"trainer_version={trainer_version} and max_staleness={max_staleness} must be ≥ 0")
    if groups_per_version < 1:
        raise ValueError(f"groups_per_version={groups_per_version} must be ≥ 1")
    return (trainer_version + max_staleness + 1) * groups_per_version


class AdmissionCounter:
    """The run's started-groups counter (entries: groups) and the trainer's published policy version."""

    def __init__(self, client: redis.Redis, config: RedisConfig):
        self.client, self.config = client, config
        self.started_key = f"{config.key_prefix}admission:started"
        self.version_key = f"{config.key_prefix}trainer_version"
        self._reserve = client.register_script(_RESERVE)
        self._release = client.register_script(_RELEASE)
        self._set_version = client.register_script(_SET_VERSION)

    def reserve(self, allowed: int) -> bool:
        """Take a slot for one group: atomically count it as started if the total stays ≤ ``allowed``.

        A retry after a lost reply may take a slot twice; the cost is one group fewer in the run.
        """
        taken = retrying(
            self.client, self.config, "reserving a group slot", lambda: self._reserve([self.started_key], [allowed])
        )
        return bool(taken)

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots: groups dropped as stale, dead-lettered, or never written.

        Raises:
            ValueError: ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"cannot release {n} slots (must be ≥ 0)")
        if n == 0:
            return
        started = retrying(
            self.client, self.config, "releasing group slots", lambda: self._release([self.started_key], [n])
        )
        if started < 0:
            logger.warning("released %d slots but only %d were started; the counter is clamped at 0", n, started + n)

    def started(self) -> int:
        """Groups started and not released."""
        value = retrying(
            self.client, self.config, "reading the started groups", lambda: self.client.get(self.started_key)
        )
        return int(value or 0)

    def set_trainer_version(self, version: int) -> None:
        """Publish the trainer's current policy version (samplers compute their allowance from it).

        Raises:
            ValueError: ``version`` is negative or below the version already published (versions only grow,
                across trainer restarts too).
        """
        if version < 0:
            raise ValueError(f"policy version {version} must be ≥ 0")
        stored = retrying(
            self.client,
            self.config,
            "publishing the trainer version",
            lambda: self._set_version([self.version_key], [version]),
        )
        if stored != version:
            raise ValueError(f"policy version {version} is below the published trainer version {stored}")

    def trainer_version(self) -> int:
        """The trainer's current policy version; 0 before the trainer has published one."""
        value = retrying(
            self.client, self.config, "reading the trainer version", lambda: self.client.get(self.version_key)
        )
        return int(value or 0)
