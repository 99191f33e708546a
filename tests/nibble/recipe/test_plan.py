"""The precision plan of docs/design.md §3: which weight runs in which format."""

import pytest
from pydantic import ValidationError

from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan, bf16_tail_layers


@pytest.mark.parametrize(("layers", "kept"), [(48, 7), (20, 3), (40, 6), (4, 1), (1, 0)])
def test_bf16_tail_counts(layers, kept):
    assert bf16_tail_layers(layers, 0.15) == kept
    assert len(PrecisionPlan(num_layers=layers).bf16_layers) == kept


def test_twenty_layers_keep_exactly_the_last_three_in_bf16():
    plan = PrecisionPlan(num_layers=20)
    expert = "model.layers.{}.mlp.experts.{}.gate_proj.weight"
    assert [plan.format_of(expert.format(i, 0)) for i in range(20)] == ["nvfp4"] * 17 + ["bf16"] * 3
    assert plan.format_of("model.layers.16.mlp.experts.gate_up_proj") == "nvfp4"
    assert plan.format_of("model.layers.17.mlp.experts.down_proj") == "bf16"


def test_every_routed_expert_weight_is_nvfp4_and_the_rest_bf16():
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers, bf16_last_fraction=0.0)
    model = MoETransformer(config, plan)
    for name, _ in model.named_parameters():
        expected = "nvfp4" if ".mlp.experts." in name else "bf16"
        assert plan.format_of(name) == expected, name
    assert plan.format_of("model.layers.0.mlp.shared_expert.up_proj.weight") == "bf16"
    assert plan.format_of("model.layers.0.self_attn.q_proj.weight") == "bf16"
    assert plan.format_of("model.layers.0.mlp.gate.weight") == "bf16"  # the router
    assert plan.format_of("lm_head.weight") == "bf16"


def test_toggles_extend_the_plan():
    plan = PrecisionPlan(num_layers=8, bf16_shared_experts=False, quantize="all_linear", format="mxfp8")
    assert plan.format_of("model.layers.0.mlp.shared_expert.up_proj.weight") == "mxfp8"
    assert plan.format_of("model.layers.0.mlp.down_proj.weight") == "mxfp8"
    assert plan.format_of("model.layers.7.mlp.down_proj.weight") == "bf16"  # in the BF16 tail
    assert plan.four_over_six is None  # 4/6 is an NVFP4 notion
    assert PrecisionPlan(num_layers=8, format="bf16").format_of("model.layers.0.mlp.experts.down_proj") == "bf16"


def test_trainer_and_sampler_plans_built_from_the_same_config_are_equal():
    options = {"num_layers": 4, "four_over_six": "mae", "backward": "dequantized"}
    assert PrecisionPlan(**options) == PrecisionPlan(**options)
    assert PrecisionPlan(**options) != PrecisionPlan(**{**options, "four_over_six": "mse"})


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"bf16_last_fraction": 1.5}, "bf16_last_fraction"),
        ({"bf16_last_fraction": -0.1}, "bf16_last_fraction"),
        ({"format": "fp4"}, "format"),
        ({"backward": "straight"}, "backward"),
        ({"quantise": "experts"}, "quantise"),
    ],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ValidationError, match=field):
        PrecisionPlan(num_layers=4, **options)


def test_describe_lists_knobs_and_formats():
    text = PrecisionPlan(num_layers=20).describe(["model.layers.0.mlp.experts.gate_up_proj", "lm_head.weight"])
    assert "bf16 tail layers" in text and "[17, 18, 19]" in text
    assert "model.layers.0.mlp.experts.gate_up_proj  nvfp4" in text


def test_quantised_weights_get_no_weight_decay():
    import torch

    from nibble.recipe import param_groups

    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers)
    model = MoETransformer(config, plan)
    groups = param_groups(model, plan, weight_decay=0.1)
    by_decay = {g["weight_decay"]: set(g["names"]) for g in groups}
    assert "model.layers.0.mlp.experts.gate_up_proj" in by_decay[0.0]
    assert "model.layers.3.mlp.experts.gate_up_proj" in by_decay[0.1]  # the BF16 tail layer decays
    assert "model.layers.0.self_attn.q_proj.weight" in by_decay[0.1]
    assert "model.norm.weight" in by_decay[0.0]
    total = sum(len(g["params"]) for g in groups)
    assert total == len(list(model.parameters()))
    torch.optim.AdamW(groups, lr=1e-3)  # AdamW accepts the groups as they are
    with pytest.raises(ValueError, match="weight_decay"):
        param_groups(model, plan, weight_decay=-1.0)
