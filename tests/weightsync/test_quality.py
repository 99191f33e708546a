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
UP = "model.layers.0.mlp.up_proj.weight"


@pytest.mark.parametrize("name", [EXPERTS, DENSE])
@pytest.mark.parametrize("sharing", ["shared", "separate"])
def test_map_to_4_fraction_and_rel_error_match_the_quantiser(name, sharing):
    plan = PrecisionPlan(num_layers=4, quantize="all_linear", gate_up_global_scale=sharing)
    shape = (3, 48, 64) if name == EXPERTS else (48, 64)
    weight = heavy_tailed(shape, seed=1, dtype=torch.bfloat16)
    weight[0] = 0  # an all-zero expert / row: its blocks tie and keep map-to-6
    published = {name: weight}
    if name == DENSE:  # up holds the larger amax: under 'shared' it sets gate's global scale too
        published[UP] = heavy_tailed(shape, seed=2, dtype=torch.bfloat16) * 4
    measured = quality.measure(published, quantize_state(published, plan), plan)

    # the reference: what the quantiser itself chose, on the tensor whose amax sets each global scale
    if name == EXPERTS:
        sets = [weight.reshape(3, -1)]
    elif sharing == "shared":
        sets = [torch.cat((weight, published[UP]))]
    else:
        sets = [weight, published[UP]]
    scale = "per_token" if name == EXPERTS else "per_tensor"
    refs = [nvfp4.quantize_with_choices(x, scale=scale, four_over_six="mse") for x in sets]
    assert measured.nvfp4_blocks == sum(choices.numel() for _, choices in refs)
    assert measured.map_to_4_blocks == sum(int(choices.sum()) for _, choices in refs) > 0
    dequantized = refs[0][0].dequantize()[: shape[0]].reshape(shape)
    assert measured.rel_error[name] == pytest.approx(rel_mse(dequantized, weight.float()), rel=1e-9)


def test_mxfp8_weights_report_an_error_and_no_4_over_6_blocks():
    plan = PrecisionPlan(num_layers=4, format="mxfp8")
    weight = heavy_tailed((2, 32, 64), seed=2, dtype=torch.bfloat16)
    measured = quality.measure({EXPERTS: weight}, quantize_state({EXPERTS: weight}, plan), plan)
    assert 0 < measured.rel_error[EXPERTS] < 0.01 and measured.four_over_six_fraction == 0.0
