"""Trainer -> weight-sync -> sampler: the quantised form applied to a packed model is bit-exact."""

import copy

import pytest
import torch

from nibble.kernels import gemm
from nibble.kernels.fragments import to_fragments
from nibble.model import MoETransformer, tiny
from nibble.recipe import PlannedExperts, PlannedLinear, PrecisionPlan
from nibble.recipe.export import load_sampler_state, published_state, quantize_state


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_a_sampler_loaded_from_weight_sync_form_computes_the_trainers_bits(fmt):
    torch.manual_seed(0)
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers, format=fmt)
    trainer = MoETransformer(config, plan)
    torch.manual_seed(1)
    sampler = MoETransformer(config, plan).pack()  # different initial weights
    state = quantize_state(published_state(trainer), plan)
    assert any("::codes" in n or "::elements" in n for n in state)
    assert all(t.dtype != torch.float32 or n.endswith("::global_scale") for n, t in state.items())
    load_sampler_state(sampler, state)
    ids = torch.randint(1, 32, (2, 9))
    with torch.no_grad():
        assert torch.equal(sampler(ids), trainer(ids))


def test_mismatched_state_is_rejected_naming_the_tensor():
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers)
    model = MoETransformer(config, plan)
    sampler = copy.deepcopy(model).pack()
    state = quantize_state(published_state(model), plan)
    broken = dict(state)
    broken.pop("lm_head.weight")
    with pytest.raises(ValueError, match="missing"):
        load_sampler_state(sampler, broken)
    broken = dict(state)
    broken["model.norm.weight"] = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_sampler_state(sampler, broken)
    with pytest.raises(ValueError, match="bfloat16"):
        quantize_state({"model.norm.weight": torch.ones(4)}, plan)


def test_a_weight_update_refreshes_the_samplers_fragment_layout():
    """A CUDA sampler keeps each NVFP4 weight also in the fragment layout its decode GEMM reads; a weight
    update copies new codes in place and must rewrite that layout in place too (a captured CUDA graph keeps
    reading the same storage). Here the layout is attached by hand, as sampler_form does on CUDA."""
    torch.manual_seed(0)
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers)
    trainer = MoETransformer(config, plan)
    torch.manual_seed(1)
    sampler = MoETransformer(config, plan).pack()
    prepared = []
    for module in sampler.modules():
        if isinstance(module, PlannedExperts) and module.packed is not None:
            module.packed = tuple(gemm.with_fragments(q) for q in module.packed)
            prepared += list(module.packed)
        elif isinstance(module, PlannedLinear) and module.packed is not None and module.fmt == "nvfp4":
            module.packed = gemm.with_fragments(module.packed)
            prepared.append(module.packed)
    assert prepared
    storage = [q.fragments.words.data_ptr() for q in prepared]
    load_sampler_state(sampler, quantize_state(published_state(trainer), plan))
    for q, pointer in zip(prepared, storage, strict=True):
        fresh = to_fragments(q.codes, q.block_scales)
        assert q.fragments.words.data_ptr() == pointer
        assert torch.equal(q.fragments.words, fresh.words) and torch.equal(q.fragments.scales, fresh.scales)
