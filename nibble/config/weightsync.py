"""The weight-sync service's section: ports, store, security, exports."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from nibble.config.base import Section


class WeightSyncConfig(Section):
    """The weight-sync service: versioned store, quantise-once, fan-out (docs/design.md §5)."""

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
