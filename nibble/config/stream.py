"""The trajectory stream's section (``redis``): connection, stream names, queue bound, sampler liveness."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from nibble.config.base import Section


class RedisConfig(Section):
    """The trajectory stream (docs/design.md §5)."""

    url: str = "redis://127.0.0.1:6379/0"
    password_file: Path | None = Field(None, description="file holding the Redis password (or NIBBLE_REDIS_PASSWORD)")
    tls: bool = False
    tls_ca_file: Path | None = Field(None, description="CA that signed Redis's certificate (default: system CAs)")
    stream: str = "nibble:trajectories"
    dead_letter_stream: str = "nibble:trajectories:dead"
    dead_letter_max_entries: int = Field(
        10_000, ge=1, description="the dead-letter stream keeps about this many newest entries"
    )
    consumer_group: str = "trainer"
    claim_idle_seconds: float = Field(
        30.0, gt=0, description="pending entries of a silent consumer are claimed after this"
    )
    queue_capacity: int = Field(64, ge=1, description="undelivered groups above which samplers pause (never trimmed)")
    admission_lease_seconds: float = Field(
        30.0, gt=0, description="a sampler's unwritten admission slots come back this long after it stops renewing"
    )
    key_prefix: str = "nibble:"
    connect_timeout_seconds: float = Field(5.0, gt=0, description="TCP/TLS connect timeout, and the start-up ping's")
    socket_timeout_seconds: float = Field(
        10.0, gt=0, description="a reply later than this counts as a lost connection; blocking reads must be shorter"
    )
    retry_seconds: float = Field(
        60.0, ge=0, description="a lost Redis is retried (backoff 0.1 s doubling to 5 s) this long before failing"
    )
    sampler_heartbeat_seconds: float = Field(
        5.0, gt=0, description="samplers record that they are alive this often (the trainer counts them)"
    )
    sampler_timeout_seconds: float = Field(
        30.0, gt=0, description="a sampler silent for longer no longer counts as live (nibble_sampler_demand)"
    )

    @model_validator(mode="after")
    def _timeout_above_heartbeat(self) -> RedisConfig:
        if self.sampler_timeout_seconds <= self.sampler_heartbeat_seconds:
            raise ValueError(
                f"redis.sampler_timeout_seconds={self.sampler_timeout_seconds} must exceed "
                f"redis.sampler_heartbeat_seconds={self.sampler_heartbeat_seconds} (live samplers would blink out)"
            )
        return self
