"""The stabilisation recipe: precision plan, quantised operands, quantised layers and their autograd."""

from nibble.recipe.linear import QuantizedMatmul, quantized_matmul
from nibble.recipe.modules import PlannedExperts, PlannedLinear
from nibble.recipe.optim import param_groups
from nibble.recipe.plan import PrecisionPlan, bf16_tail_layers
from nibble.recipe.quant import fake_quantize, quantize_activation, quantize_weight

__all__ = [
    "PlannedExperts",
    "PlannedLinear",
    "PrecisionPlan",
    "QuantizedMatmul",
    "bf16_tail_layers",
    "fake_quantize",
    "param_groups",
    "quantize_activation",
    "quantize_weight",
    "quantized_matmul",
]
