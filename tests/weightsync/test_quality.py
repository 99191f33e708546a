"""The quality metrics: 4/6 choices read back from the stored scales equal the quantiser's own."""

import pytest
import torch

from nibble.kernels import nvfp4
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import quantize_state
from nibble.weightsync import quality
from tests.helpers import heavy_tailed, rel_mse

EXPERTS = "model.layers.0.mlp.experts.gate_up_proj"
DENSE = "model.layers.0.mlp.gate_proj.weight"


@pytest.mark.parametrize("name", [EXPERTS, DENSE])
def test_map_to_4_fraction_and_rel_error_match_the_quantiser(name):
    plan = PrecisionPlan(num_layers=4, quantize="all_linear")
    shape = (3, 48, 64) if name == EXPERTS else (48, 64)
    weight = heavy_tailed(shape, seed=1, dtype=torch.bfloat16)
    weight[0] = 0  # an all-zero expert / row: its blocks tie and keep map-to-6
    measured = quality.measure({name: weight}, quantize_state({name: weight}, plan), plan)

    flat = weight.reshape(3, -1) if name == EXPERTS else weight
    scale = "per_token" if name == EXPERTS else "per_tensor"
    q_ref, map_to_4_ref = nvfp4.quantize_with_choices(flat, scale=scale, four_over_six="mse")
    assert measured.nvfp4_blocks == map_to_4_ref.numel()
    assert measured.map_to_4_blocks == int(map_to_4_ref.sum()) > 0
    assert measured.rel_error[name] == pytest.approx(rel_mse(q_ref.dequantize(), flat.float()), rel=1e-9)


def test_mxfp8_weights_report_an_error_and_no_4_over_6_blocks():
    plan = PrecisionPlan(num_layers=4, format="mxfp8")
    weight = heavy_tailed((2, 32, 64), seed=2, dtype=torch.bfloat16)
    measured = quality.measure({EXPERTS: weight}, quantize_state({EXPERTS: weight}, plan), plan)
    assert 0 < measured.rel_error[EXPERTS] < 0.01 and measured.four_over_six_fraction == 0.0
