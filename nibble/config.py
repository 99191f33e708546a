"""Run configuration: one pydantic model per service plus the run's composite, from YAML + environment.

Every model forbids unknown keys, so a misspelt or renamed key fails loudly, naming it. Environment
variables override YAML values: ``NIBBLE_TRAINER__LEARNING_RATE=1e-4`` sets ``trainer.learning_rate``
(``nibble.config_env``: every ``NIBBLE_*`` variable applies or fails, naming itself). Secrets (tokens, passwords) are
never values here, only the files or environment variables they are read from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from nibble import config_env, devices

Device = Annotated[str, AfterValidator(lambda v: devices.check("device", v))]
"""``cpu``, ``cuda`` or ``cuda:N`` (physical GPU N; see :mod:`nibble.devices`)."""
MemoryFraction = Annotated[float | None, Field(None, gt=0, le=1)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanConfig(Section):
    """The precision plan's knobs (DESIGN.md §3); ``nibble.recipe.PrecisionPlan`` adds the layer count."""

    format: Literal["bf16", "mxfp8", "nvfp4"] = "nvfp4"
    four_over_six: Literal["mse", "mae"] | None = "mse"
    activation_scale: Literal["per_token", "per_tensor"] = "per_token"
    bf16_last_fraction: float = Field(0.15, ge=0.0, le=1.0)
    bf16_shared_experts: bool = True
    quantize: Literal["experts", "all_linear"] = "experts"
    backward: Literal["high_precision", "dequantized", "quantized"] = "dequantized"
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto: bfloat16 on CUDA, float32 on CPU (both sides must resolve the same way)"
    )
    gate_up_global_scale: Literal["shared", "separate"] = Field(
        "shared", description="NVFP4 dense gate_proj/up_proj: one global scale for the pair, as engines fuse them"
    )


class TaskConfig(Section):
    """Which task prompts and rewards come from (``nibble.tasks.get_task(name, **options)``)."""

    name: str = "addition"
    options: dict[str, Any] = Field(default_factory=lambda: {"digits": 2, "eval_size": 512, "holdout_fraction": 0.1})


class ModelSection(Section):
    """The policy: a warm-start checkpoint (HF format), trained by ``nibble sft`` when missing."""

    checkpoint: Path = Path("runs/warm_start")
    sft_steps: int = Field(1000, ge=1, description="SFT step budget when the checkpoint must be made")
    sft_target_accuracy: float = Field(
        0.3, gt=0.0, le=1.0, description="leaves RL room to show (lands 0.3-0.36 on 2-digit addition)"
    )
    sft_threads: int = Field(
        1, ge=1, description="torch threads of the warm start (on busy cores, 2 ran 5x slower than 1)"
    )


class RedisConfig(Section):
    """The trajectory stream (DESIGN.md §5)."""

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


class WeightSyncConfig(Section):
    """The weight-sync service: versioned store, quantise-once, fan-out (DESIGN.md §5)."""

    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535, description="WeightSync (samplers); 0 = any free port")
    publish_port: int = Field(50052, ge=0, le=65535, description="WeightPublisher (trainer only)")
    store_dir: Path = Path("runs/weights")
    keep_versions: int = Field(3, ge=1)
    chunk_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=4 * 1024 * 1024, description="≤ gRPC's 4 MiB default")
    publish_token_file: Path | None = Field(None, description="bearer token file (or NIBBLE_PUBLISH_TOKEN)")
    fetch_token_file: Path | None = Field(None, description="bearer token file (or NIBBLE_FETCH_TOKEN)")
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = Field(None, description="clients: CA that signed the server certificate")
    tls_client_ca_file: Path | None = Field(
        None, description="server: mutual TLS, every client must present a certificate this CA signed"
    )
    tls_client_cert_file: Path | None = Field(None, description="clients: own certificate, for mutual TLS")
    tls_client_key_file: Path | None = None
    rpc_timeout_seconds: float = Field(60.0, gt=0, description="deadline of unary RPCs and of each chunk")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics; 0 = any free port")
    max_payload_bytes: int = Field(
        128 * 1024**3, ge=1, description="largest publication accepted (bytes); its buffer is allocated up front"
    )
    server_threads: int = Field(
        64, ge=4, description="gRPC worker threads per port: bounds concurrent watches + fetches (one thread each)"
    )
    shutdown_grace_seconds: float = Field(5.0, ge=0, description="on SIGTERM, in-flight RPCs get this long to finish")
    threads: int = Field(
        1, ge=1, description="torch threads for quantisation (more than the free cores slows it down many times)"
    )
    export_format: Literal["none", "compressed-tensors", "modelopt"] = Field(
        "none",
        description="also write each version as an NVFP4 checkpoint directory in this layout (SGLang/vLLM load it "
        "from disk); compressed-tensors stores the global encode scale, modelopt the decode scale",
    )
    export_dir: Path | None = Field(
        None, description="where exports go, one v<version>/ each; default <store_dir>/export"
    )
    export_model_dir: Path | None = Field(
        None,
        description="model directory (e.g. model.checkpoint) whose config.json and tokenizer files each export "
        "carries; unset: config.json holds only quantization_config",
    )

    @property
    def export_root(self) -> Path:
        """Where version exports go (weight-sync writes them, an SGLang sampler's server reads them):
        ``export_dir``, or ``<store_dir>/export``."""
        return self.export_dir or self.store_dir / "export"

    @model_validator(mode="after")
    def _ports_differ(self) -> WeightSyncConfig:
        if self.export_dir is not None and self.export_dir.resolve() == self.store_dir.resolve():
            raise ValueError("weightsync.export_dir must differ from weightsync.store_dir (versions would collide)")
        if self.port and self.port == self.publish_port:
            raise ValueError(f"weightsync.port and weightsync.publish_port are both {self.port}; they must differ")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("weightsync.tls_cert_file and weightsync.tls_key_file go together")
        if (self.tls_client_cert_file is None) != (self.tls_client_key_file is None):
            raise ValueError("weightsync.tls_client_cert_file and weightsync.tls_client_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(
                "weightsync.tls_client_ca_file (mutual TLS) needs the server's tls_cert_file and tls_key_file"
            )
        return self


class SamplerConfig(Section):
    """A sampler: generation engine, rewards, admission control (DESIGN.md §5)."""

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


class TrainerConfig(Section):
    """The trainer: batches, objective (DESIGN.md §4), optimiser, publishing, checkpoints."""

    total_steps: int = Field(450, ge=1)
    groups_per_step: int = Field(8, ge=1, description="whole GRPO groups per consumed batch")
    updates_per_batch: int = Field(1, ge=1)
    learning_rate: float = Field(2e-4, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    clip_low: float = Field(0.2, ge=0, lt=1)
    clip_high: float = Field(0.28, ge=0)
    correction: Literal["tis", "mis", "rs", "none"] = "tis"
    correction_level: Literal["token", "sequence", "geometric"] = "token"
    cap: float = Field(2.0, gt=1)
    kl_coef: float = Field(0.0, ge=0)
    max_staleness: int = Field(2, ge=0)
    drop_zero_std_groups: bool = False
    publish_every: int = Field(1, ge=1)
    eval_every: int = Field(20, ge=1)
    checkpoint_every: int = Field(1, ge=1, description="entries are acknowledged only once checkpointed")
    checkpoint_dir: Path = Path("runs/trainer")
    ledger_size: int = Field(1_000_000, ge=1, description="trained trajectory_ids remembered in the checkpoint")
    threads: int = Field(1, ge=1)
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: str = Field("127.0.0.1", description="address /metrics binds; 0.0.0.0 in a pod Prometheus scrapes")
    health_port: int | None = Field(
        None, ge=1, le=65535, description="gRPC health checking on metrics_host (containers); None: not served"
    )
    device: Device = Field("cpu", description="cuda / cuda:N; under torchrun (nproc_per_node > 1) cuda only")
    gpu_memory_fraction: MemoryFraction = Field(
        None, description="share of the GPU's memory the trainer may allocate (when it shares the GPU)"
    )
    nproc_per_node: int = Field(
        1, ge=1, description="trainer processes (torchrun --nproc-per-node); above 1, FSDP2 shards the model"
    )
    collective_timeout_s: float = Field(
        3600.0, gt=0, description="sharded: how long ranks wait in a collective, e.g. for rank 0's next batch"
    )
    backend: Literal["nibble", "transformer_engine"] = Field(
        "nibble",
        description="nibble: Nibble's NVFP4 modules (CPU, any CUDA GPU); transformer_engine: TE's NVFP4 recipe, "
        "which needs TE's compiled core and a Blackwell GPU (not built yet: refused at start-up, naming what is "
        "missing)",
    )

    @model_validator(mode="after")
    def _backend_has_a_device(self) -> TrainerConfig:
        if self.backend == "transformer_engine" and self.device == "cpu":
            raise ValueError(
                "trainer.backend=transformer_engine needs trainer.device: cuda on a Blackwell GPU (Transformer "
                "Engine's NVFP4 recipe refuses the CPU and Hopper), and is not built yet; use trainer.backend: nibble"
            )
        return self


class RunConfig(Section):
    """A whole run: what ``nibble run`` launches and every service reads its section of."""

    seed: int = 0
    num_samplers: int = Field(
        2, ge=1, description="samplers `nibble run` starts; the trainer counts live ones (heartbeats), not this"
    )
    model: ModelSection = ModelSection()
    task: TaskConfig = TaskConfig()
    plan: PlanConfig = PlanConfig()
    redis: RedisConfig = RedisConfig()
    weightsync: WeightSyncConfig = WeightSyncConfig()
    sampler: SamplerConfig = SamplerConfig()
    trainer: TrainerConfig = TrainerConfig()

    @model_validator(mode="after")
    def _can_make_progress(self) -> RunConfig:
        t, r = self.trainer, self.redis
        if r.queue_capacity < t.groups_per_step:
            raise ValueError(
                f"redis.queue_capacity={r.queue_capacity} < trainer.groups_per_step={t.groups_per_step}: "
                "samplers would pause before the trainer has a full batch"
            )
        from nibble.transport.stream.admission import allowed_groups  # here: that module imports this one

        # At version 0 the rule gives one version's window: what samplers may start before a publication.
        allowed = allowed_groups(0, t.max_staleness, t.groups_per_step * t.publish_every)
        if self.sampler.groups_per_batch > allowed:
            raise ValueError(
                f"sampler.groups_per_batch={self.sampler.groups_per_batch} exceeds what admission control allows "
                f"per version ((max_staleness + 1) x groups_per_step x publish_every = {allowed})"
            )
        self._check_placement()
        self._check_sglang()
        if t.groups_per_step % t.updates_per_batch:
            raise ValueError(
                f"trainer.groups_per_step={t.groups_per_step} is not divisible by "
                f"trainer.updates_per_batch={t.updates_per_batch} (each update takes whole groups)"
            )
        return self

    @property
    def plan_device(self) -> str:
        """The device kind ``plan.compute_dtype: auto`` resolves for on every service: the trainer's (bfloat16
        when it is on CUDA, float32 on the CPU). A CPU sampler of a CUDA trainer then computes in bfloat16
        too, so both sides round alike and publish the same plan."""
        return "cpu" if self.trainer.device == "cpu" else "cuda"

    def _check_sglang(self) -> None:
        """SGLang servers load every version from weight-sync's NVFP4 export, one server per sampler."""
        s = self.sampler
        if s.engine != "sglang":
            return
        if self.weightsync.export_format == "none":
            raise ValueError(
                "sampler.engine=sglang loads each version from weight-sync's export: set weightsync.export_format "
                "(compressed-tensors or modelopt) and weightsync.export_dir to a path the SGLang servers read"
            )
        if self.plan.format != "nvfp4":
            raise ValueError(
                f"sampler.engine=sglang samples from weight-sync's NVFP4 export; plan.format={self.plan.format} "
                "has no such export (use sampler.engine: builtin)"
            )
        if len(s.sglang_urls) != self.num_samplers:
            raise ValueError(
                f"sampler.sglang_urls has {len(s.sglang_urls)} servers for num_samplers={self.num_samplers}: each "
                "sampler drives its own server (two would swap each other's weights)"
            )

    def _check_placement(self) -> None:
        """torchrun ranks take ``cuda``; GPUs shared by several services must not be promised more than their
        memory."""
        t, s = self.trainer, self.sampler
        if t.nproc_per_node > 1 and t.device not in ("cpu", "cuda"):
            raise ValueError(
                f"trainer.device={t.device} with trainer.nproc_per_node={t.nproc_per_node}: torchrun gives each "
                "rank its GPU; use trainer.device=cuda"
            )
        shares: dict[int, float] = {}
        for device, fraction, count in (
            (t.device, t.gpu_memory_fraction, t.nproc_per_node),
            (s.device, s.gpu_memory_fraction, self.num_samplers),
        ):
            index = devices.gpu_index(device)
            if index is not None and fraction is not None:
                shares[index] = shares.get(index, 0.0) + fraction * count
        for index, total in shares.items():
            if total > 1.0 + 1e-9:
                raise ValueError(
                    f"GPU {index} is promised {total:.2f} of its memory (trainer.gpu_memory_fraction + "
                    "num_samplers x sampler.gpu_memory_fraction on it); the shares must add up to at most 1"
                )


def load(path: Path | None, environ: Mapping[str, str] | None = None) -> RunConfig:
    """Read ``path`` (YAML; ``None`` = all defaults), apply ``NIBBLE_*`` overrides, validate.

    Raises:
        ValueError: naming the file and the key — or the environment variable, for a value it set — for an
            unreadable/invalid YAML file, an unknown key or variable, a wrong type or value, or settings
            that cannot make progress.
    """
    return load_with_overrides(path, environ)[0]


def load_with_overrides(
    path: Path | None, environ: Mapping[str, str] | None = None, data: dict[str, Any] | None = None
) -> tuple[RunConfig, config_env.Overrides]:
    """:func:`load`, also returning which keys the environment set; with ``data``, that mapping (already
    read from ``path``, e.g. a run's recorded config) instead of the file's contents.

    Raises:
        ValueError: as :func:`load`.
    """
    if data is None:
        data = _read(path)
    overrides = config_env.apply(data, os.environ if environ is None else environ, RunConfig)
    try:
        return RunConfig.model_validate(data), overrides
    except ValidationError as exc:
        raise ValueError(_describe(exc, path, overrides)) from None


def _read(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of sections")
    return data


def _describe(exc: ValidationError, path: Path | None, overrides: config_env.Overrides) -> str:
    """One line per problem, blaming the environment variable that set the value when one did."""
    source = str(path) if path is not None else "config"
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        variable = overrides.variable_for(error["loc"]) if error["loc"] else None
        if variable is not None:
            lines.append(f"{variable}: {where}: {error['msg']}")
        elif where:
            lines.append(f"{source}: {where}: {error['msg']}")
        else:  # a cross-field check: the file and every variable may have a part in it
            also = f" with {', '.join(sorted(overrides.by_key.values()))}" if overrides.by_key else ""
            lines.append(f"{source}{also}: {error['msg']}")
    return "; ".join(lines)
