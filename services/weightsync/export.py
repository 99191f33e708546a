"""Each stored version also as an NVFP4 checkpoint directory (``weightsync.export_format``), for engines
that load weights from disk (SGLang's and vLLM's ``update_weights_from_disk``).

``<export_dir>/v<version, 20 digits>/`` in the compressed-tensors or ModelOpt layout
(:mod:`nibble.interop`), written from the very bytes weight-sync stores and serves (no second
quantisation), complete or absent (a temporary directory renamed into place), the last
``keep_versions`` kept. It is written before the version is announced, so an announced version is on
disk.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import torch

from nibble.config import WeightSyncConfig
from nibble.interop import QuantizedCheckpoint, export_checkpoint, version_dir
from nibble.recipe.plan import PrecisionPlan

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"^v\d{20}$")


class VersionExporter:
    """Writes versions under ``config.export_dir`` (default ``<store_dir>/export``) in ``config.export_format``.

    Raises:
        ValueError: ``export_model_dir`` has no readable ``config.json``.
    """

    def __init__(self, config: WeightSyncConfig):
        self.layout = config.export_format
        self.root = config.export_root
        self.keep = config.keep_versions
        self.model_dir = config.export_model_dir
        self.model_config = _model_config(self.model_dir) if self.model_dir is not None else None
        self.root.mkdir(parents=True, exist_ok=True)

    def write(self, version: int, quantized: dict[str, torch.Tensor], plan: PrecisionPlan) -> Path:
        """Write ``version`` (weight-sync's quantised form) and drop exports beyond the newest ``keep``."""
        checkpoint = QuantizedCheckpoint(quantized, self.model_config, plan)
        out = export_checkpoint(
            checkpoint, version_dir(self.root, version), self.layout, tokenizer_from=self.model_dir, overwrite=True
        )
        for old in sorted(p for p in self.root.iterdir() if _VERSION_DIR.match(p.name))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("version %d exported as %s to %s", version, self.layout, out)
        return out


def _model_config(model_dir: Path) -> dict:
    file = Path(model_dir) / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"weightsync.export_model_dir: {file} is not a readable config.json ({exc})") from exc
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"  # unquantised tensors are stored as the trainer publishes them
    return config
