"""Splitting weight-sync's fused state into per-module NVFP4 weights and back; the encode scale whose
float32 reciprocal is exactly Nibble's decode scale."""

import pytest
import torch

from nibble.interop import decode_scale, encode_scale, fuse_state, split_state
from nibble.kernels import nvfp4
from tests.nibble.interop.conftest import assert_same_state


def test_split_then_fuse_gives_back_every_byte(moe, dense):
    for checkpoint in (moe, dense):
        modules, rest = split_state(checkpoint.state)
        assert_same_state(fuse_state(modules, rest), checkpoint.state)


def test_experts_split_into_gate_up_down_per_expert_sharing_the_stack_scale(moe):
    modules, rest = split_state(moe.state)
    stack = "model.layers.0.mlp.experts.gate_up_proj"
    codes, g = moe.state[f"{stack}::codes"], moe.state[f"{stack}::global_scale"]
    gate, up = modules["model.layers.0.mlp.experts.5.gate_proj"], modules["model.layers.0.mlp.experts.5.up_proj"]
    half = codes.shape[1] // 2
    assert torch.equal(gate.codes, codes[5, :half]) and torch.equal(up.codes, codes[5, half:])
    assert gate.global_scale.shape == () and gate.global_scale.item() == up.global_scale.item() == g[5].item()
    assert "model.layers.3.mlp.experts.7.down_proj.weight" in rest  # the BF16 tail layer, per expert too


def test_gate_and_up_with_different_global_scales_are_refused(moe):
    modules, rest = split_state(moe.state)
    up = "model.layers.1.mlp.experts.2.up_proj"
    modules[up] = modules[up].__class__(modules[up].codes, modules[up].block_scales, modules[up].global_scale * 2)
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.experts\.gate_up_proj: expert 2's gate_proj and up_proj"):
        fuse_state(modules, rest)


def test_a_missing_expert_is_named(moe):
    modules, rest = split_state(moe.state)
    del modules["model.layers.0.mlp.experts.3.down_proj"]
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.0\.mlp\.experts\.3\.down_proj'\]"):
        fuse_state(modules, rest)


def test_an_mxfp8_state_has_no_form_in_these_layouts():
    state = {"w::elements": torch.zeros(4, 32, dtype=torch.float8_e4m3fn), "w::block_scales": torch.zeros(4, 1)}
    with pytest.raises(ValueError, match=r"w: holds parts \['block_scales', 'elements'\]; only NVFP4"):
        split_state(state)


def decode_scales() -> torch.Tensor:
    """Global decode scales as Nibble computes them: amax over 70 decades, 4/6 on and off, zero tensors."""
    gen = torch.Generator().manual_seed(0)
    found = []
    for exponent in range(-36, 36, 2):
        for four_over_six in (None, "mse"):
            x = torch.randn(4, 32, generator=gen) * 10.0**exponent
            found.append(nvfp4.quantize(x, four_over_six=four_over_six).global_scale)
    found.append(nvfp4.quantize(torch.zeros(2, 16)).global_scale)  # g = 2^-128 (S = FLT_MAX)
    amax = torch.rand(4000, generator=gen) * 4 + 1  # every mantissa region of g, at one exponent
    found.append(torch.ones(4000) / torch.minimum(torch.full((4000,), 2688.0) / amax, torch.tensor(3.4e38)))
    return torch.cat([g.reshape(-1) for g in found])


def test_the_encode_scale_decodes_to_exactly_nibbles_decode_scale():
    g = decode_scales()
    s = encode_scale(g)
    assert s.dtype == torch.float32 and bool(torch.isfinite(s).all())
    assert torch.equal(decode_scale(s).view(torch.int32), g.view(torch.int32))
    assert encode_scale(torch.tensor([2.0**-128])).item() == torch.finfo(torch.float32).max


def test_a_decode_scale_that_is_not_a_reciprocal_is_refused():
    with pytest.raises(ValueError, match="positive finite"):
        encode_scale(torch.tensor([0.0, 1.0]))


def test_dense_gate_and_up_with_their_own_scales_are_flagged_expert_stacks_never(moe, dense):
    from nibble.interop import fused_scale_conflicts

    from .conftest import DENSE, quantized

    assert fused_scale_conflicts(split_state(moe.state)[0]) == []
    assert fused_scale_conflicts(split_state(dense.state)[0]) == []  # the plan's default: one scale for the pair
    separate = dense.plan.model_copy(update={"gate_up_global_scale": "separate"})
    # each dense projection on its own scale: layers 0 and 1 are NVFP4, layer 2 BF16
    assert fused_scale_conflicts(split_state(quantized(DENSE, separate, seed=1).state)[0]) == [
        "model.layers.0.mlp.{gate_proj,up_proj}",
        "model.layers.1.mlp.{gate_proj,up_proj}",
    ]
