"""``nibble import-model``: a GGUF written by the ``gguf`` package (as llama.cpp's converter lays out a Llama)
and an HF directory become Nibble checkpoints whose logits match transformers; bad input is named."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

import nibble.cli.import_model  # noqa: F401  (registers the sub-command)
from nibble.cli import app
from nibble.model import from_pretrained
from nibble.model.importer import import_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TOKENS = [*sorted(ByteLevel.alphabet()), "Ġt", "he", "Ġthe", *SPECIALS]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
HEADS, KV_HEADS = 4, 2


def hf_llama(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(TOKENS),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=128,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(config).eval()
    for param in model.parameters():  # bf16-representable, and norms away from 1
        if param.dim() == 1:
            param.data += 0.1 * torch.randn_like(param)
        param.data = param.data.to(torch.bfloat16).to(torch.float32)
    return model


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (rotary halves interleaved per head), which GGUF readers undo."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, weight.shape[1]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(
    model: LlamaForCausalLM, path: Path, *, quantize_mlp: bool = False, arch: str = "llama", rope_freqs: bool = False
) -> Path:
    """The model as llama.cpp's converter writes a Llama: GGUF names, permuted q/k, F32 tensors (Q8_0 MLPs)."""
    c = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type("model")
    writer.add_name("tiny-llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(TOKENS) - 3) + [gguf.TokenType.CONTROL] * 3)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(TOKENS.index("<|im_start|>"))
    writer.add_eos_token_id(TOKENS.index("<|im_end|>"))
    writer.add_chat_template(TEMPLATE)
    names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }  # fmt: skip
    for name, tensor in model.state_dict().items():
        array = tensor.numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            out = "output.weight"
        else:
            _, _, layer, *module, leaf = name.split(".")
            out = f"blk.{layer}.{names['.'.join(module)]}.{leaf}"
            if module == ["self_attn", "q_proj"]:
                array = llama_cpp_permute(array, HEADS)
            elif module == ["self_attn", "k_proj"]:
                array = llama_cpp_permute(array, KV_HEADS)
        if quantize_mlp and "ffn_" in out and array.ndim == 2:
            q8 = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(out, q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(out, array)
    if rope_freqs:  # Llama 3.1's frequency factors, as llama.cpp's converter stores them
        writer.add_tensor("rope_freqs.weight", np.ones(c.hidden_size // c.num_attention_heads // 2, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_llama_imports_with_transformers_logits_tokenizer_and_chat_template(tmp_path):
    original = hf_llama(tied=True)
    source = write_gguf(original, tmp_path / "tiny.gguf")
    result = CliRunner().invoke(app, ["import-model", str(source), "--out", str(tmp_path / "ckpt")])
    assert result.exit_code == 0, result.output
    assert "llama" in result.stdout and "all_linear" in result.stdout
    out = tmp_path / "ckpt"
    written = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in written and written["tie_word_embeddings"] is True
    assert written["architectures"] == ["LlamaForCausalLM"]

    ours = from_pretrained(out).eval()
    assert ours.config.architecture == "llama" and ours.lm_head.weight is ours.model.embed_tokens.weight
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").eval()
    ids = torch.randint(0, len(TOKENS), (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = ours(ids)
        assert logits.abs().max() > 0.5
        torch.testing.assert_close(logits, reference(ids).logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits, original(ids).logits, atol=1e-4, rtol=1e-4)  # q/k permutation undone

    settings = json.loads((out / "tokenizer_config.json").read_text())
    assert settings["chat_template"] == TEMPLATE and settings["eos_token"] == "<|im_end|>"
    assert not list(out.glob("chat_template.*"))
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    encoded = tokenizer.encode("the cat").ids
    assert TOKENS.index("Ġthe") not in encoded and TOKENS.index("he") in encoded  # merges applied
    assert tokenizer.decode(encoded) == "the cat"
    chat = AutoTokenizer.from_pretrained(str(out)).apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"


def test_quantised_gguf_tensors_arrive_as_the_bf16_cast_of_their_dequantised_values(tmp_path):
    source = write_gguf(hf_llama(tied=False), tmp_path / "q8.gguf", quantize_mlp=True)
    import_model(source, tmp_path / "ckpt")
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q8.gguf").state_dict()
    ours = from_pretrained(tmp_path / "ckpt").state_dict()
    assert set(ours) == set(reference)
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference[name].to(torch.bfloat16).to(torch.float32)), name
    down = reference["model.layers.0.mlp.down_proj.weight"]
    assert not torch.equal(down, down.to(torch.bfloat16).to(torch.float32))  # Q8_0 values are not bf16 already


def test_an_hf_directory_imports_and_keeps_its_chat_template(tmp_path):
    model = hf_llama(tied=False)
    write_gguf(model, tmp_path / "tiny.gguf")
    hf_dir = tmp_path / "hf"
    model.save_pretrained(hf_dir)
    AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").save_pretrained(hf_dir)
    result = import_model(hf_dir, tmp_path / "ckpt", dtype=torch.float32)
    assert result.chat_template and result.config.architecture == "llama"
    assert json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    ids = torch.randint(0, len(TOKENS), (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(
            from_pretrained(tmp_path / "ckpt")(ids), from_pretrained(hf_dir)(ids), atol=0, rtol=0
        )


def test_bad_input_is_named(tmp_path):
    model = hf_llama(tied=True)
    with pytest.raises(ValueError, match="no such file"):
        import_model(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "notes.gguf").write_text("not a model")
    with pytest.raises(ValueError, match="not a GGUF file"):
        import_model(tmp_path / "notes.gguf", tmp_path / "out")
    with pytest.raises(ValueError, match="'bert' is not a causal LM"):
        import_model(write_gguf(model, tmp_path / "bert.gguf", arch="bert"), tmp_path / "out")
    with pytest.raises(ValueError, match="'gemma3' is not supported; Nibble imports llama"):
        import_model(write_gguf(model, tmp_path / "gemma.gguf", arch="gemma3"), tmp_path / "out")
    hf_dir = tmp_path / "mistral"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({**model.config.to_dict(), "model_type": "mistral"}))
    with pytest.raises(ValueError, match="model_type='mistral'"):
        import_model(hf_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    source = str(write_gguf(model, tmp_path / "ok.gguf"))
    result = CliRunner().invoke(app, ["import-model", source, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "already exists and is not empty" in result.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    result = CliRunner().invoke(app, ["import-model", source, "--out", str(tmp_path / "out"), "--overwrite"])
    assert result.exit_code == 2 and "replaces a model checkpoint only" in result.stderr  # not any folder
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_overwrite_never_deletes_the_source_and_replaces_a_checkpoint_whole(tmp_path):
    model = hf_llama(tied=True)
    (tmp_path / "ckpt").mkdir()
    source = write_gguf(model, tmp_path / "ckpt" / "src.gguf")
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="must not be the source or a folder holding it"):
        import_model(source, tmp_path / "ckpt", overwrite=True)
    assert source.is_file()
    out = tmp_path / "out"
    import_model(source, out)
    first = (out / "model.safetensors").read_bytes()
    import_model(source, out, overwrite=True, dtype=torch.float32)
    assert (out / "model.safetensors").read_bytes() != first and not list(tmp_path.glob(".out.*"))
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in out.iterdir())  # readable by a pod's user
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        import_model(source, tmp_path / "file", overwrite=True)


def test_a_gguf_with_scaled_rope_is_refused_not_imported_as_plain_rope(tmp_path):
    source = write_gguf(hf_llama(tied=True), tmp_path / "llama31.gguf", rope_freqs=True)
    with pytest.raises(ValueError, match=r"scaled RoPE \(rope_freqs\.weight\)"):
        import_model(source, tmp_path / "out")
