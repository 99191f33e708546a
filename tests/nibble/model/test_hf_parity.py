"""Logits agree with Hugging Face transformers' Qwen3-MoE and Qwen2-MoE (the reference nobody here wrote)."""

import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from nibble.model import KVCache, from_pretrained

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=6,
    num_experts_per_tok=2,
    max_position_embeddings=128,
    initializer_range=0.2,  # larger than HF's default so logits are far from zero and errors show
)


def hf_model(kind: str, tmp_path):
    torch.manual_seed(0)
    if kind == "qwen3_moe":
        config = Qwen3MoeConfig(**COMMON, head_dim=16, mlp_only_layers=[1], norm_topk_prob=True)
        model = Qwen3MoeForCausalLM(config)
    else:
        config = Qwen2MoeConfig(**COMMON, shared_expert_intermediate_size=48)
        model = Qwen2MoeForCausalLM(config)
    # Nibble computes every weight through its bf16 cast: give HF bf16-representable float32 weights.
    # (parameters only: a bf16 round trip of the RoPE buffers would change HF's frequencies)
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16).to(torch.float32)
    model.eval()
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_logits_match_transformers(kind, tmp_path):
    ref_model = hf_model(kind, tmp_path)
    sut_model = from_pretrained(tmp_path)
    ids = torch.randint(0, 96, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = ref_model(ids).logits
        sut = sut_model(ids)
    assert sut.dtype == torch.float32 and sut.shape == ref.shape
    assert ref.abs().max() > 0.5
    torch.testing.assert_close(sut, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_kv_cache_decoding_matches_transformers(kind, tmp_path):
    ref_model = hf_model(kind, tmp_path)
    sut_model = from_pretrained(tmp_path)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    cache = KVCache(sut_model.config, batch=2, max_len=12, dtype=torch.float32)
    with torch.no_grad():
        ref = ref_model(ids).logits
        chunks = [sut_model(ids[:, :7], kv_cache=cache)]
        chunks += [sut_model(ids[:, t : t + 1], kv_cache=cache) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), ref, atol=1e-4, rtol=1e-4)


def test_fused_expert_layout_loads_the_same_model(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_model("qwen3_moe", tmp_path)
    per_expert = from_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    fused = {}
    for layer in (0, 2):
        prefix = f"model.layers.{layer}.mlp.experts"
        gate = torch.stack([tensors.pop(f"{prefix}.{e}.gate_proj.weight") for e in range(6)])
        up = torch.stack([tensors.pop(f"{prefix}.{e}.up_proj.weight") for e in range(6)])
        fused[f"{prefix}.gate_up_proj"] = torch.cat([gate, up], dim=1)
        fused[f"{prefix}.down_proj"] = torch.stack([tensors.pop(f"{prefix}.{e}.down_proj.weight") for e in range(6)])
    save_file({**tensors, **fused}, str(tmp_path / "model.safetensors"))
    loaded = from_pretrained(tmp_path)
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids), per_expert(ids))


def test_save_pretrained_round_trips_and_transformers_reads_it(tmp_path):
    hf_model("qwen2_moe", tmp_path / "a")
    ours = from_pretrained(tmp_path / "a")
    ours.save_pretrained(tmp_path / "b")
    again = Qwen2MoeForCausalLM.from_pretrained(tmp_path / "b").eval()
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), again(ids).logits, atol=1e-4, rtol=1e-4)


def test_sharded_checkpoint_with_an_index_loads(tmp_path):
    ref_model = hf_model("qwen3_moe", tmp_path / "single")
    ref_model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    (tmp_path / "sharded" / "unrelated.safetensors").write_bytes(b"not a shard")  # never read
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(
            from_pretrained(tmp_path / "sharded")(ids), ref_model(ids).logits, atol=1e-4, rtol=1e-4
        )
