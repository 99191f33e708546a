"""Admission control (AReaL's rule, docs/design.md §5): samplers start a group only while the groups started
stay ≤ :func:`nibble.config.admission.allowed_groups` of ``v``, the trainer's current policy version.

Both numbers live in Redis (keys under ``RedisConfig.key_prefix``), so every sampler and the trainer see
the same ones, across restarts of any of them.
"""

from __future__ import annotations

import logging

import redis

from nibble.config import RedisConfig
from nibble.transport.stream.connection import retrying

logger = logging.getLogger(__name__)

# Reclaim what holders whose lease ran out still hold (KEYS[1] started, KEYS[2] held, KEYS[3] leases).
_RECLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reclaimed = 0
for _, holder in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  local n = tonumber(redis.call('HGET', KEYS[2], holder) or '0')
  if n > 0 then
    reclaimed = reclaimed + n
    if redis.call('DECRBY', KEYS[1], n) < 0 then redis.call('SET', KEYS[1], 0) end
  end
  redis.call('HDEL', KEYS[2], holder)
  redis.call('ZREM', KEYS[3], holder)
end
"""
# ARGV[1] = allowed, ARGV[2] = holder, ARGV[3] = lease ms: after reclaiming expired leases, count one more
# start only while the total stays ≤ allowed, held by ``holder`` under a lease renewed to now + lease ms.
_RESERVE = (
    _RECLAIM
    + """
local started = tonumber(redis.call('GET', KEYS[1]) or '0')
if started + 1 > tonumber(ARGV[1]) then return {0, reclaimed} end
redis.call('INCR', KEYS[1])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[2])
return {1, reclaimed}
"""
)
_RECLAIM_ONLY = _RECLAIM + "return reclaimed\n"
# KEYS[1] started, KEYS[2] held; ARGV[1] = holder: one of its reservations became a written group. A slot
# reclaimed meanwhile (the lease ran out) is counted again, so started stays = written + reserved.
_COMMIT = """
local n = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if n > 0 then redis.call('HINCRBY', KEYS[2], ARGV[1], -1) else redis.call('INCR', KEYS[1]) end
return n
"""
# KEYS[1] started, KEYS[2] held; ARGV[1] = n, ARGV[2] = holder or '': give n slots back, never going below
# 0 (a holder's share likewise); returns the unclamped value.
_RELEASE = """
local n = tonumber(ARGV[1])
if ARGV[2] ~= '' then
  n = math.min(n, tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0'))
  if n <= 0 then return tonumber(redis.call('GET', KEYS[1]) or '0') end
  redis.call('HINCRBY', KEYS[2], ARGV[2], -n)
end
local started = redis.call('DECRBY', KEYS[1], n)
if started < 0 then redis.call('SET', KEYS[1], 0) end
return started
"""
# KEYS[1] leases, KEYS[2] held; ARGV[1] = holder, ARGV[2] = lease ms: extend a live holder's lease.
_RENEW = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2]), ARGV[1])
return 1
"""
# KEYS[1] = version key, ARGV[1] = v: store v unless a larger version is stored; returns what is stored.
_SET_VERSION = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) < current then return current end
redis.call('SET', KEYS[1], ARGV[1])
return tonumber(ARGV[1])
"""


class AdmissionCounter:
    """The run's started-groups counter (entries: groups) and the trainer's published policy version.

    ``started`` = groups written and not yet trained, dropped or dead-lettered + slots reserved and not yet
    written. Every reservation is held by a named holder (a sampler process) under a lease of
    ``admission_lease_seconds`` that the holder renews while alive; a holder that dies or hangs stops
    renewing, and the next :meth:`reserve` by anyone (or :meth:`reclaim`) gives its unwritten slots back.
    """

    def __init__(self, client: redis.Redis, config: RedisConfig):
        self.client, self.config = client, config
        self.started_key = f"{config.key_prefix}admission:started"
        self.held_key = f"{config.key_prefix}admission:held"
        self.leases_key = f"{config.key_prefix}admission:leases"
        self.version_key = f"{config.key_prefix}trainer_version"
        self.lease_ms = max(1, round(config.admission_lease_seconds * 1000))
        self._reserve = client.register_script(_RESERVE)
        self._reclaim = client.register_script(_RECLAIM_ONLY)
        self._commit = client.register_script(_COMMIT)
        self._release = client.register_script(_RELEASE)
        self._renew = client.register_script(_RENEW)
        self._set_version = client.register_script(_SET_VERSION)

    @property
    def _slot_keys(self) -> list[str]:
        return [self.started_key, self.held_key, self.leases_key]

    def reserve(self, allowed: int, holder: str) -> bool:
        """Take a slot for one group, held by ``holder``: atomically count it as started if the total stays
        ≤ ``allowed`` (after giving back the slots of every holder whose lease ran out), and renew
        ``holder``'s lease.

        A retry after a lost reply may take a slot twice; the extra one comes back with the lease.

        Raises:
            ValueError: an empty ``holder``.
        """
        if not holder:
            raise ValueError("a slot needs a non-empty holder name")
        taken, reclaimed = retrying(
            self.client,
            self.config,
            "reserving a group slot",
            lambda: self._reserve(self._slot_keys, [allowed, holder, self.lease_ms]),
        )
        if reclaimed:
            logger.warning("reclaimed %d admission slots from samplers whose lease ran out", reclaimed)
        return bool(taken)

    def reclaim(self) -> int:
        """Give back the slots of holders whose lease ran out; returns how many."""
        return int(retrying(self.client, self.config, "reclaiming slots", lambda: self._reclaim(self._slot_keys)))

    def renew(self, holder: str) -> bool:
        """Extend ``holder``'s lease to now + ``admission_lease_seconds``; False when it holds nothing (never
        reserved, or its lease already ran out and its slots were reclaimed)."""
        renewed = retrying(
            self.client,
            self.config,
            "renewing the admission lease",
            lambda: self._renew([self.leases_key, self.held_key], [holder, self.lease_ms]),
        )
        return bool(renewed)

    def commit(self, holder: str, pipe: redis.client.Pipeline) -> None:
        """Queue on ``pipe`` (the transaction that writes the group) turning one of ``holder``'s reservations
        into a written group: the slot stays counted in ``started`` but no longer expires with the lease."""
        self._commit([self.started_key, self.held_key], [holder], client=pipe)

    def release(self, n: int = 1, holder: str | None = None) -> None:
        """Give back ``n`` slots: groups dropped as stale or dead-lettered (``holder=None``: the trainer), or
        reservations ``holder`` will not write (an engine error, a refused or empty group; at most what
        ``holder`` still holds).

        Raises:
            ValueError: ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"cannot release {n} slots (must be ≥ 0)")
        if n == 0:
            return
        started = retrying(
            self.client,
            self.config,
            "releasing group slots",
            lambda: self._release([self.started_key, self.held_key], [n, holder or ""]),
        )
        if started < 0:
            logger.warning("released %d slots but only %d were started; the counter is clamped at 0", n, started + n)

    def held(self, holder: str) -> int:
        """Reservations ``holder`` holds and has not written."""
        value = retrying(
            self.client, self.config, "reading held slots", lambda: self.client.hget(self.held_key, holder)
        )
        return int(value or 0)

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
