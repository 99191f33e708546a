"""A checkpoint that does not match its config fails with an error naming what is wrong."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from nibble.model import MoETransformer, from_pretrained, tiny
from nibble.recipe import PrecisionPlan


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    MoETransformer(tiny(vocab_size=32)).save_pretrained(tmp_path)
    return tmp_path


def rewrite(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_round_trip_loads(checkpoint):
    model = from_pretrained(checkpoint)
    assert model.config == tiny(vocab_size=32)


def test_shape_mismatch_names_the_tensor(checkpoint):
    rewrite(checkpoint, lambda t: t.__setitem__("model.norm.weight", torch.ones(64)))
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(64,\)"):
        from_pretrained(checkpoint)


def test_missing_and_unexpected_tensors_are_listed(checkpoint):
    def edit(t):
        t.pop("model.layers.1.self_attn.q_proj.weight")
        t["model.layers.9.extra.weight"] = torch.ones(2, 2)

    rewrite(checkpoint, edit)
    with pytest.raises(ValueError, match=r"missing tensors \['model\.layers\.1\.self_attn\.q_proj\.weight'\]"):
        from_pretrained(checkpoint)


def test_missing_expert_is_named(checkpoint):
    rewrite(checkpoint, lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(ValueError, match=r"experts\.5\.up_proj\.weight"):
        from_pretrained(checkpoint)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda c: c.update(model_type="gpt2"), "model_type='gpt2'"),
        (lambda c: c.pop("hidden_size"), "hidden_size"),
        (lambda c: c.update(num_experts_per_tok=99), "num_experts_per_tok=99"),
        (lambda c: c.update(num_attention_heads=3), "num_attention_heads=3"),
        (lambda c: c.update(bogus=1), "config key 'bogus' is not supported"),  # never silently dropped
    ],
)
def test_bad_config_names_the_field(checkpoint, edit, match):
    config = json.loads((checkpoint / "config.json").read_text())
    edit(config)
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        from_pretrained(checkpoint)


def test_plan_for_another_depth_is_refused(checkpoint):
    with pytest.raises(ValueError, match="plan is for 6 layers, model has 4"):
        from_pretrained(checkpoint, plan=PrecisionPlan(num_layers=6))


def test_qwen3_30b_a3b_shaped_config_has_the_real_layer_dimensions():
    from nibble.model import qwen3_30b_a3b_shaped

    config = qwen3_30b_a3b_shaped(num_layers=2)
    with torch.device("meta"):
        model = MoETransformer(config, PrecisionPlan(num_layers=2))
    experts = model.model.layers[0].mlp.experts
    assert tuple(experts.gate_up_proj.shape) == (128, 2 * 768, 2048)
    assert tuple(experts.down_proj.shape) == (128, 2048, 768)
    assert config.num_experts_per_tok == 8 and config.head_dim == 128
    assert model.num_parameters() > 1_000_000_000  # 2 layers of 30B-A3B's experts plus embeddings
