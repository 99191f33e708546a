"""The loader implements a config.json key (and matches transformers within 1e-4) or refuses it naming the
key: nothing is dropped. The issue's input: a Qwen3-MoE config with YaRN rope parameters."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from nibble.model import from_pretrained, load_config
from nibble.model.config import ModelConfig

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 1e4}
COMMON = dict(
    vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
    max_position_embeddings=512, initializer_range=0.2, norm_topk_prob=True,
)  # fmt: skip


def hf_yarn_model(tmp_path, rope_parameters=YARN) -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**COMMON, rope_parameters=dict(rope_parameters)))
    for param in model.parameters():  # bf16-representable, as Nibble computes through the bf16 cast
        param.data = param.data.to(torch.bfloat16).to(torch.float32)
    model.eval().save_pretrained(tmp_path)
    return model


def test_yarn_logits_match_transformers_and_survive_to_hf(tmp_path):
    reference = hf_yarn_model(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    assert ours.config.rope_scaling is not None and ours.config.rope_scaling.factor == 4.0
    # positions far beyond the original 128-token context, where YaRN changes the frequencies most
    ids = torch.randint(0, 96, (2, 300), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = reference(ids).logits, ours(ids)
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)

    ours.save_pretrained(tmp_path / "ours")  # to_hf keeps the rope type: transformers reads the same model
    written = json.loads((tmp_path / "ours" / "config.json").read_text())["rope_parameters"]
    assert written == {**YARN, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
    assert load_config(tmp_path / "ours") == ours.config
    again = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, expected, atol=1e-4, rtol=1e-4)


def test_yarn_spelt_as_the_older_rope_scaling_loads_the_same():
    hf = {**Qwen3MoeConfig(**COMMON).to_dict(), "rope_parameters": None}
    old = {
        **hf,
        "rope_theta": 1e4,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    }
    new = {**hf, "rope_parameters": YARN}
    assert ModelConfig.from_hf(old) == ModelConfig.from_hf(new)


def base_hf() -> dict:
    return json.loads(Qwen3MoeConfig(**COMMON).to_json_string())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"quantization_config": {"quant_method": "fp8"}}, "'quantization_config'"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}, "rope_type='llama3'"),
        ({"rope_parameters": {**YARN, "extrapolation": 2}}, "rope_parameters.extrapolation"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}}, "'factor'"),
        ({"rope_parameters": {**YARN, "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
        ({"use_sliding_window": True, "sliding_window": 64}, "use_sliding_window=True"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"mlp_bias": True}, "mlp_bias=True"),  # attention_bias is implemented (Llama, Qwen3)
        ({"attention_dropout": 0.1}, "attention_dropout=0.1"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": None}, "rope_type='linear'"),
    ],
    ids=lambda x: next(iter(x)) if isinstance(x, dict) else None,
)
def test_keys_nibble_does_not_implement_are_refused_by_name(tmp_path, change, named):
    hf = base_hf()
    assert ModelConfig.from_hf(hf)  # transformers' own config loads as it is
    (tmp_path / "config.json").write_text(json.dumps({**hf, **change}))
    with pytest.raises(ValueError, match=f"config.json: .*{re.escape(named)}"):
        load_config(tmp_path)
