"""What is trained: the warm-start policy and the precision plan its linear layers run in."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from nibble.config.base import Section


class PlanConfig(Section):
    """The precision plan's knobs (docs/design.md §3); ``nibble.recipe.PrecisionPlan`` adds the layer count."""

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
