"""One NVFP4 global scale for a dense MLP's gate and up (``gate_up_global_scale: shared``): the scale an
engine uses once it fuses them into ``gate_up_proj``, on the trainer, in the sampler form and in weight-sync's
form alike."""

from __future__ import annotations

import pytest
import torch

from nibble.kernels import nvfp4
from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import load_sampler_state, published_state, quantize_state
from nibble.recipe.quant import quantize_weight, quantize_weights_together
from tests.helpers import TINY_LLAMA, heavy_tailed

GATE, UP, DOWN = (f"model.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj"))


def dense_plan(**options) -> PrecisionPlan:
    return PrecisionPlan(num_layers=3, quantize="all_linear", bf16_last_fraction=0.0, **options)


def test_weights_quantised_together_are_the_slices_of_their_concatenation():
    gate, up = heavy_tailed((48, 64), seed=1), heavy_tailed((32, 64), seed=2) * 9  # up holds the larger amax
    plan = dense_plan()
    q_gate, q_up = quantize_weights_together((gate, up), plan)
    fused = nvfp4.quantize(torch.cat((gate, up)).to(torch.bfloat16), four_over_six="mse")
    assert torch.equal(torch.cat((q_gate.codes, q_up.codes)), fused.codes)
    assert torch.equal(
        torch.cat((q_gate.block_scales, q_up.block_scales)).view(torch.uint8), fused.block_scales.view(torch.uint8)
    )
    assert q_gate.global_scale.item() == q_up.global_scale.item() == fused.global_scale.item()
    assert q_gate.shape == (48, 64) and q_up.shape == (32, 64)
    # the gate's own scale would be smaller: sharing changes its codes, which is the point
    assert quantize_weight(gate, "nvfp4", plan).global_scale.item() < q_gate.global_scale.item()


@pytest.mark.parametrize(
    "shapes", [[(16, 64)], [(16, 64), (16, 32)], [(2, 16, 64), (2, 16, 64)]], ids=["one", "two-k", "stacks"]
)
def test_weights_that_cannot_share_one_scale_are_refused(shapes):
    with pytest.raises(ValueError, match="one K"):
        quantize_weights_together([torch.zeros(s) for s in shapes], dense_plan())


def test_the_plan_names_the_pair_only_for_nvfp4_dense_and_shared_expert_projections():
    plan = dense_plan()
    assert plan.scale_group(GATE) == plan.scale_group(UP) == (GATE, UP)
    assert plan.scale_group(DOWN) is None
    assert plan.scale_group("model.layers.0.mlp.experts.gate_up_proj") is None  # a stack shares already
    assert plan.scale_group("model.layers.0.self_attn.q_proj.weight") is None
    assert dense_plan(gate_up_global_scale="separate").scale_group(GATE) is None
    assert dense_plan(format="mxfp8").scale_group(GATE) is None  # MXFP8 has no global scale
    shared_expert = "model.layers.1.mlp.shared_expert.up_proj.weight"
    unshared = PrecisionPlan(num_layers=4, bf16_shared_experts=False)
    assert unshared.scale_group(shared_expert) == (shared_expert.replace("up_proj", "gate_proj"), shared_expert)
    assert PrecisionPlan(num_layers=4).scale_group(shared_expert) is None  # BF16 shared experts


@pytest.mark.parametrize("sharing", ["shared", "separate"])
def test_trainer_sampler_form_and_weight_sync_agree_bit_for_bit(sharing):
    torch.manual_seed(0)
    plan = dense_plan(gate_up_global_scale=sharing)
    trainer = MoETransformer(TINY_LLAMA, plan).eval()
    with torch.no_grad():
        trainer.model.layers[0].mlp.up_proj.weight.mul_(8)  # make gate's and up's own scales differ
    sampler = MoETransformer(TINY_LLAMA, plan).eval().pack()
    load_sampler_state(sampler, quantize_state(published_state(trainer), plan))
    packed = MoETransformer(TINY_LLAMA, plan).eval()
    packed.load_state_dict(trainer.state_dict())
    packed.pack()
    ids = torch.randint(0, TINY_LLAMA.vocab_size, (2, 7))
    with torch.no_grad():
        reference = trainer(ids)
        assert torch.equal(sampler(ids), reference)
        assert torch.equal(packed(ids), reference)
    mlp = sampler.model.layers[0].mlp
    same = mlp.gate_proj.packed.global_scale.item() == mlp.up_proj.packed.global_scale.item()
    assert same == (sharing == "shared")


def test_gradients_reach_both_masters_through_the_shared_quantisation():
    torch.manual_seed(0)
    model = MoETransformer(TINY_LLAMA, dense_plan())
    model(torch.randint(0, TINY_LLAMA.vocab_size, (2, 7))).float().pow(2).mean().backward()
    mlp = model.model.layers[0].mlp
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (mlp.gate_proj.weight, mlp.up_proj.weight))


def test_a_moe_shared_expert_in_nvfp4_shares_its_gate_and_up_scale():
    torch.manual_seed(0)
    plan = PrecisionPlan(num_layers=4, bf16_shared_experts=False)
    trainer = MoETransformer(tiny(vocab_size=32), plan).eval()
    sampler = MoETransformer(tiny(vocab_size=32), plan).eval().pack()
    load_sampler_state(sampler, quantize_state(published_state(trainer), plan))
    expert = sampler.model.layers[0].mlp.shared_expert
    assert expert.gate_proj.packed.global_scale.item() == expert.up_proj.packed.global_scale.item()
    ids = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        assert torch.equal(sampler(ids), trainer(ids))


def test_weight_sync_refuses_half_a_pair():
    plan = dense_plan()
    with pytest.raises(ValueError, match="shares its global scale"):
        quantize_state({GATE: torch.zeros(96, 64, dtype=torch.bfloat16)}, plan)


def test_a_pair_of_unequal_widths_is_refused_naming_both():
    state = {GATE: torch.zeros(96, 64, dtype=torch.bfloat16), UP: torch.zeros(96, 32, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match=rf"{GATE} and {UP}: weights quantised together"):
        quantize_state(state, dense_plan())
