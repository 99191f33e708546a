"""The sampler's section: generation, engine, rewards, placement."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from nibble.config.base import Device, MemoryFraction, Section


class SamplerConfig(Section):
    """A sampler: generation engine, rewards, admission control (docs/design.md §5)."""

    group_size: int = Field(8, ge=2, description="responses per prompt (G)")
    groups_per_batch: int = Field(4, ge=1, description="groups generated together between weight swaps")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int | None = Field(None, ge=1, description="default: the task's max_response_tokens")
    reward_timeout_seconds: float = Field(5.0, gt=0)
    max_engine_failures: int = Field(
        3, ge=1, description="consecutive generation errors (each batch's slots given back) before the sampler exits"
    )
    threads: int = Field(1, ge=1, description="torch threads per sampler process")
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: str = Field("127.0.0.1", description="address /metrics binds; 0.0.0.0 in a pod Prometheus scrapes")
    health_port: int | None = Field(
        None, ge=1, le=65535, description="gRPC health checking on metrics_host (containers); None: not served"
    )
    device: Device = Field("cpu", description="cuda / cuda:N: decode with packed NVFP4 kernels and CUDA graphs")
    gpu_memory_fraction: MemoryFraction = Field(
        None, description="share of the GPU's memory each sampler may allocate (when it shares the GPU)"
    )
    engine: Literal["builtin", "sglang"] = Field(
        "builtin",
        description="builtin: Nibble's own engine in the sampler process; sglang: drive an SGLang server over its "
        "HTTP API (one per sampler, sglang_urls), which loads each version from weightsync.export_dir",
    )
    sglang_urls: list[str] = Field(
        default_factory=list,
        description="engine=sglang: one SGLang server per sampler (http://host:port); sampler-<i> drives the i-th",
    )
    sglang_timeout_seconds: float = Field(
        600.0, gt=0, description="engine=sglang: read timeout of each request (a whole batch must generate in it)"
    )
    sglang_connect_timeout_seconds: float = Field(5.0, gt=0, description="engine=sglang: TCP connect timeout")
    sglang_retry_seconds: float = Field(
        60.0, ge=0, description="engine=sglang: 503s and refused connections are retried (backoff) this long"
    )
    sglang_startup_seconds: float = Field(
        600.0, gt=0, description="engine=sglang: how long a sampler waits for its server's /health_generate"
    )
    http_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve SGLang's /generate (for sglang-router and SGLang clients) on metrics_host; 0 = any free "
        "port; None: not served",
    )

    @model_validator(mode="after")
    def _sglang_has_servers(self) -> SamplerConfig:
        if self.engine == "sglang" and not self.sglang_urls:
            raise ValueError("sampler.engine=sglang needs sampler.sglang_urls (one SGLang server per sampler)")
        for url in self.sglang_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"sampler.sglang_urls: {url!r} is not an http:// or https:// URL")
        return self
