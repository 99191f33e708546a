"""The precision variants of the stability grid and the plan each gives a model.

docs/design.md §3; "the three" techniques are per-token activation scales, four-over-six and the
dequantised backward: ``bf16``; ``mxfp8`` (dequantised backward, the recipe's BF16 exceptions);
``nvfp4_naive`` (per-tensor activation scale, no 4/6, high-precision backward, no BF16 exceptions);
each single technique and each pair added to the naive one (still no BF16 exceptions, so each differs
from the naive variant only in the techniques it names); ``nvfp4_three`` (all three, no BF16
exceptions); ``recipe`` (all three plus the last 15% of layers and the shared experts in BF16).
"""

from __future__ import annotations

import torch

from nibble.recipe import PrecisionPlan

_NAIVE = {
    "format": "nvfp4",
    "activation_scale": "per_tensor",
    "four_over_six": None,
    "backward": "high_precision",
    "bf16_last_fraction": 0.0,
    "bf16_shared_experts": False,
}
_TECHNIQUES = {
    "token": {"activation_scale": "per_token"},
    "4o6": {"four_over_six": "mse"},
    "deq": {"backward": "dequantized"},
}
_BF16_EXCEPTIONS = {"bf16_last_fraction": 0.15, "bf16_shared_experts": True}


def _nvfp4(*techniques: str, bf16_exceptions: bool = False) -> dict:
    knobs = dict(_NAIVE)
    for name in techniques:
        knobs.update(_TECHNIQUES[name])
    return {**knobs, **(_BF16_EXCEPTIONS if bf16_exceptions else {})}


# Plan knobs (``PrecisionPlan`` fields besides ``num_layers``, ``quantize`` and ``compute_dtype``) of every
# variant, in table order.
VARIANTS: dict[str, dict] = {
    "bf16": {"format": "bf16"},
    "mxfp8": {"format": "mxfp8", "backward": "dequantized", **_BF16_EXCEPTIONS},
    "nvfp4_naive": _nvfp4(),
    "nvfp4_token": _nvfp4("token"),
    "nvfp4_4o6": _nvfp4("4o6"),
    "nvfp4_deq": _nvfp4("deq"),
    "nvfp4_token_4o6": _nvfp4("token", "4o6"),
    "nvfp4_token_deq": _nvfp4("token", "deq"),
    "nvfp4_4o6_deq": _nvfp4("4o6", "deq"),
    "nvfp4_three": _nvfp4("token", "4o6", "deq"),
    "recipe": _nvfp4("token", "4o6", "deq", bf16_exceptions=True),
}


def plan_for(variant: str, num_layers: int, quantize: str, device: str) -> PrecisionPlan:
    """``variant``'s plan for a model of ``num_layers`` layers: ``quantize`` (``experts`` for MoEs,
    ``all_linear`` for dense models, which have no experts) and the compute dtype of ``device``
    (bfloat16 on CUDA, float32 elsewhere, as the services resolve ``compute_dtype: auto``).

    Raises:
        ValueError: an unknown ``variant``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {sorted(VARIANTS)}")
    compute_dtype = "bfloat16" if torch.device(device).type == "cuda" else "float32"
    return PrecisionPlan(num_layers=num_layers, quantize=quantize, compute_dtype=compute_dtype, **VARIANTS[variant])
