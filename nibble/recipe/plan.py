"""The precision plan: one object naming the number format of every linear weight (docs/design.md §3).

Trainer, sampler, weight-sync and checkpoints all read the same plan, so a layer can never be BF16 on
one side and NVFP4 on the other. Parameter names are Hugging Face Qwen-MoE names, in either expert
layout (``...mlp.experts.3.gate_proj.weight`` or the fused ``...mlp.experts.gate_up_proj``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

Format = Literal["bf16", "mxfp8", "nvfp4"]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ROUTED_EXPERT = re.compile(r"\.mlp\.experts\.")
_SHARED_EXPERT = re.compile(r"\.mlp\.shared_expert\.")
_DENSE_MLP = re.compile(r"\.mlp\.(gate_proj|up_proj|down_proj)\.weight$")
_GATE_OR_UP = re.compile(r"^(.*\.mlp(?:\.shared_expert)?)\.(gate_proj|up_proj)\.weight$")


def bf16_tail_layers(num_layers: int, fraction: float) -> int:
    """Number of trailing decoder layers kept in BF16: ``floor(f * L + 0.5)`` (48 → 7, 20 → 3, 40 → 6).

    Evaluated exactly on the decimal the user wrote (``0.7 * 45 + 0.5`` is 32, not float's 31.999…).
    """
    return math.floor(Fraction(repr(float(fraction))) * num_layers + Fraction(1, 2))


class PrecisionPlan(BaseModel):
    """Which weights run in which format, and how quantised layers compute and differentiate.

    Attributes mirror docs/design.md §3; the plan is immutable and compares by value, so the trainer's and
    the sampler's plans can be checked for equality.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_layers: int = Field(ge=1, description="decoder layers L of the model the plan applies to")
    format: Format = Field("nvfp4", description="format of quantised weights: bf16 | mxfp8 | nvfp4")
    four_over_six: Literal["mse", "mae"] | None = Field(
        "mse", description="NVFP4 adaptive block scaling metric (mse | mae), or null for standard NVFP4"
    )
    activation_scale: Literal["per_token", "per_tensor"] = Field(
        "per_token", description="outer scale of quantised activations (the recipe: per_token)"
    )
    bf16_last_fraction: float = Field(0.15, ge=0.0, le=1.0, description="fraction f of last layers kept BF16")
    bf16_shared_experts: bool = Field(True, description="keep shared experts in BF16")
    quantize: Literal["experts", "all_linear"] = Field(
        "experts", description="experts: routed experts only; all_linear: also dense MLP projections"
    )
    backward: Literal["high_precision", "dequantized", "quantized"] = Field(
        "dequantized", description="gradients of quantised linears (the recipe: dequantized)"
    )
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of high-precision compute: bfloat16 on GPU, float32 on CPU"
    )
    gate_up_global_scale: Literal["shared", "separate"] = Field(
        "shared",
        description="NVFP4 gate_proj and up_proj of one MLP: one global scale for both (shared; vLLM and "
        "SGLang fuse them into one gate_up_proj with one scale) or one each (separate)",
    )

    @model_validator(mode="after")
    def _four_over_six_only_for_nvfp4(self) -> PrecisionPlan:
        if self.format != "nvfp4" and self.four_over_six is not None:
            object.__setattr__(self, "four_over_six", None)  # 4/6 is an NVFP4 notion; other formats ignore it
        return self

    @classmethod
    def from_config(cls, config, num_layers: int, device: torch.device | str = "cpu") -> PrecisionPlan:
        """Build from a ``nibble.config.PlanConfig``; ``compute_dtype: auto`` resolves to bfloat16 on
        CUDA and float32 elsewhere (trainer and sampler on the same kind of device resolve alike)."""
        values = config.model_dump()
        if values["compute_dtype"] == "auto":
            values["compute_dtype"] = "bfloat16" if torch.device(device).type == "cuda" else "float32"
        return cls(num_layers=num_layers, **values)

    @property
    def torch_compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.compute_dtype == "bfloat16" else torch.float32

    @property
    def bf16_layers(self) -> range:
        """Indices of the decoder layers kept entirely in BF16 (the last ``n`` of them)."""
        n = bf16_tail_layers(self.num_layers, self.bf16_last_fraction) if self.format != "bf16" else 0
        return range(self.num_layers - n, self.num_layers)

    def format_of(self, param_name: str) -> Format:
        """The format of the weight ``param_name`` (an HF-style name); everything not listed is BF16.

        Routed experts are quantised outside the BF16 tail; shared experts unless
        ``bf16_shared_experts``; dense MLP projections only with ``quantize='all_linear'``; attention,
        router, embeddings, norms, LM head and biases never.

        Raises:
            ValueError: a decoder-layer name whose index is outside ``[0, num_layers)``.
        """
        if self.format == "bf16" or not param_name.endswith(("weight", "gate_up_proj", "down_proj")):
            return "bf16"
        layer = _LAYER.search(param_name)
        if layer is None:
            return "bf16"
        index = int(layer.group(1))
        if not 0 <= index < self.num_layers:
            raise ValueError(f"{param_name}: layer {index} outside a plan for {self.num_layers} layers")
        if index in self.bf16_layers:
            return "bf16"
        if _ROUTED_EXPERT.search(param_name):
            return self.format
        if _SHARED_EXPERT.search(param_name):
            return "bf16" if self.bf16_shared_experts else self.format
        if _DENSE_MLP.search(param_name) and self.quantize == "all_linear":
            return self.format
        return "bf16"

    def scale_group(self, param_name: str) -> tuple[str, str] | None:
        """The weights quantised with one NVFP4 global scale together with ``param_name``: for a dense or
        shared-expert ``gate_proj``/``up_proj`` weight under ``gate_up_global_scale='shared'``, the pair
        ``(…gate_proj.weight, …up_proj.weight)``; ``None`` for every other weight (its own scale).

        Engines load such a pair as one fused ``gate_up_proj`` GEMM with one global scale, so a pair
        quantised with two scales would be decoded wrongly; sharing the scale of the concatenation makes
        Nibble's bytes the ones the engine computes with. Routed experts are fused stacks already.
        """
        match = _GATE_OR_UP.match(param_name)
        if match is None or self.gate_up_global_scale != "shared" or self.format_of(param_name) != "nvfp4":
            return None
        prefix = match.group(1)
        return f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"

    def describe(self, param_names: list[str] | None = None) -> str:
        """A plain-text table: the plan's knobs, then the format of each named parameter."""
        lines = [f"{key:20s} {value}" for key, value in self.model_dump().items()]
        lines.append(f"{'bf16 tail layers':20s} {list(self.bf16_layers)}")
        if param_names:
            width = max(len(n) for n in param_names)
            lines.append("")
            lines += [f"{name:{width}s}  {self.format_of(name)}" for name in param_names]
        return "\n".join(lines)
