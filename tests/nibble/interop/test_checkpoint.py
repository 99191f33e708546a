"""Export to and import from compressed-tensors and ModelOpt directories: bit-identical round trips,
the names and dtypes engines load, and errors that name the file and the tensor."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nibble.interop import dequantized_state, export_checkpoint, import_checkpoint, write_dequantized
from nibble.model import from_pretrained
from tests.nibble.interop.conftest import assert_same_state, bits

LAYOUTS = ("compressed-tensors", "modelopt")
GATE = "model.layers.0.mlp.experts.1.gate_proj"
NAMES = {  # packed, block scales, global scale: each layout's names (see nibble.interop.*)
    "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale"),
    "modelopt": ("weight", "weight_scale", "weight_scale_2"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", ["moe", "dense"])
def test_round_trip_is_bit_identical(layout, model, request, tmp_path):
    checkpoint = request.getfixturevalue(model)
    out = export_checkpoint(checkpoint, tmp_path / "out", layout)
    back = import_checkpoint(out)
    assert_same_state(back.state, checkpoint.state)
    assert back.plan == checkpoint.plan
    assert back.model_config == checkpoint.model_config


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tensors_have_the_layouts_names_dtypes_and_shapes(layout, moe, tmp_path):
    out = export_checkpoint(moe, tmp_path / "out", layout)
    tensors = load_file(out / "model.safetensors")
    packed, block, global_ = (tensors[f"{GATE}.{n}"] for n in NAMES[layout])
    assert (packed.dtype, tuple(packed.shape)) == (torch.uint8, (128, 64))  # [N, K/2], K = hidden 128
    assert (block.dtype, tuple(block.shape)) == (torch.float8_e4m3fn, (128, 8))  # [N, K/16]
    g = moe.state["model.layers.0.mlp.experts.gate_up_proj::global_scale"][1]
    if layout == "modelopt":  # a decode scale, stored as is
        assert global_.shape == () and bits(global_).tolist() == bits(g).tolist()
    else:  # an encode scale S with fl(1/S) == g
        assert (
            global_.shape == (1,) and (torch.ones(1) / global_).view(torch.int32).item() == g.view(torch.int32).item()
        )
    assert "model.layers.3.mlp.experts.0.up_proj.weight" in tensors  # BF16 tail: per-expert bf16
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert not any(n.endswith(("input_scale", "input_global_scale")) for n in tensors)  # dynamic activations


def test_compressed_tensors_config_says_nvfp4_weights_and_dynamic_nvfp4_activations(moe, tmp_path):
    config = json.loads((export_checkpoint(moe, tmp_path / "o", "compressed-tensors") / "config.json").read_text())
    q = config.pop("quantization_config")
    assert config == moe.model_config
    assert (q["quant_method"], q["format"], q["quantization_status"]) == (
        "compressed-tensors",
        "nvfp4-pack-quantized",
        "compressed",
    )
    (group,) = q["config_groups"].values()
    assert group["weights"]["dynamic"] is False and group["input_activations"]["dynamic"] is True
    for args in (group["weights"], group["input_activations"]):
        assert (args["num_bits"], args["type"], args["strategy"], args["group_size"]) == (
            4,
            "float",
            "tensor_group",
            16,
        )
    assert "lm_head" in q["ignore"] and "model.layers.3.mlp.experts.0.gate_proj" in q["ignore"]
    assert "model.layers.0.mlp.experts.0.gate_proj" not in q["ignore"]


def test_modelopt_writes_hf_quant_config_and_the_config_json_form(moe, tmp_path):
    out = export_checkpoint(moe, tmp_path / "o", "modelopt")
    hf = json.loads((out / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] == "NVFP4" and hf["quantization"]["group_size"] == 16
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (q["quant_method"], q["quant_algo"]) == ("modelopt", "NVFP4")
    assert q["ignore"] == hf["quantization"]["exclude_modules"]


def test_a_tokenizer_beside_the_source_travels_with_the_export(dense, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "tokenizer.json").write_text("{}")
    out = export_checkpoint(dense, tmp_path / "out", "modelopt", tokenizer_from=tmp_path / "src")
    assert (out / "tokenizer.json").read_text() == "{}"


def test_a_non_empty_out_is_refused_unless_overwritten_and_only_a_checkpoint_is_overwritten(dense, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    with pytest.raises(ValueError, match="exists and is not empty"):
        export_checkpoint(dense, tmp_path / "out", "modelopt")
    with pytest.raises(ValueError, match="replaces a model checkpoint only"):
        export_checkpoint(dense, tmp_path / "out", "modelopt", overwrite=True)
    assert (tmp_path / "out" / "keep").read_text() == "x"
    export_checkpoint(dense, tmp_path / "ckpt", "compressed-tensors")
    export_checkpoint(dense, tmp_path / "ckpt", "modelopt", overwrite=True)  # a checkpoint: replaced whole
    assert (tmp_path / "ckpt" / "hf_quant_config.json").is_file() and not list(tmp_path.glob(".ckpt.*"))


def test_dequantized_import_is_a_checkpoint_nibble_loads_with_nibbles_decoded_values(moe, tmp_path):
    out = write_dequantized(
        import_checkpoint(export_checkpoint(moe, tmp_path / "q", "compressed-tensors")), tmp_path / "d"
    )
    model = from_pretrained(out)
    stack = model.model.layers[0].mlp.experts.gate_up_proj
    ref = dequantized_state(moe)
    assert torch.equal(stack[1, :128], ref[f"{GATE}.weight"])
    assert "quantization_config" not in json.loads((out / "config.json").read_text())


# Bad input: each error names the file and the tensor.


def exported(checkpoint, tmp_path: Path, layout: str, edit) -> Path:
    out = export_checkpoint(checkpoint, tmp_path / "out", layout)
    file = out / "model.safetensors"
    with safe_open(str(file), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    edit(tensors)
    save_file(tensors, str(file))
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_missing_block_scale_is_named_with_its_file(layout, moe, tmp_path):
    out = exported(moe, tmp_path, layout, lambda t: t.pop(f"{GATE}.weight_scale"))
    with pytest.raises(
        ValueError, match=rf"model\.safetensors: {GATE}\.{NAMES[layout][0]} has no {GATE}\.weight_scale"
    ):
        import_checkpoint(out)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_missing_global_scale_is_named(layout, moe, tmp_path):
    global_ = NAMES[layout][2]
    out = exported(moe, tmp_path, layout, lambda t: t.pop(f"{GATE}.{global_}"))
    with pytest.raises(ValueError, match=rf"has no {GATE}\.{global_} \(its NVFP4 global"):
        import_checkpoint(out)


def test_block_scales_of_the_wrong_shape_are_named(moe, tmp_path):
    def edit(t):
        t[f"{GATE}.weight_scale"] = t[f"{GATE}.weight_scale"][:, :4].contiguous()

    out = exported(moe, tmp_path, "modelopt", edit)
    with pytest.raises(
        ValueError,
        match=rf"model\.safetensors: {GATE}: block scales must be float8_e4m3fn \[128, 8\], got \S+ \[128, 4\]",
    ):
        import_checkpoint(out)


def test_a_global_scale_of_the_wrong_dtype_is_named(moe, tmp_path):
    def edit(t):
        t[f"{GATE}.weight_global_scale"] = t[f"{GATE}.weight_global_scale"].to(torch.bfloat16)

    out = exported(moe, tmp_path, "compressed-tensors", edit)
    with pytest.raises(ValueError, match=rf"{GATE}\.weight_global_scale must be one float32, got bfloat16 \[1\]"):
        import_checkpoint(out)


def test_packed_codes_of_another_dtype_are_named(moe, tmp_path):
    def edit(t):
        t[f"{GATE}.weight_packed"] = t[f"{GATE}.weight_packed"].to(torch.int32)

    out = exported(moe, tmp_path, "compressed-tensors", edit)
    with pytest.raises(ValueError, match=rf"{GATE}: packed codes must be uint8 \[N, K/2\].*got int32"):
        import_checkpoint(out)


def test_scales_without_their_packed_weight_are_named(moe, tmp_path):
    out = exported(moe, tmp_path, "compressed-tensors", lambda t: t.pop(f"{GATE}.weight_packed"))
    with pytest.raises(ValueError, match=rf"model\.safetensors: {GATE}\.weight_\w+ has no packed weight"):
        import_checkpoint(out)


def test_a_plain_checkpoint_is_not_taken_for_an_nvfp4_one(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"config\.json: no quantization_config"):
        import_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({"quant_method": "gptq", "bits": 4}, r"quant_method 'gptq' is neither"),
        (
            {"quant_method": "compressed-tensors", "format": "float-quantized"},
            r"format 'float-quantized', Nibble reads",
        ),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, r"ModelOpt quant_algo 'FP8', Nibble reads 'NVFP4'"),
    ],
)
def test_another_quantisation_format_is_refused_naming_config_json(quantization, message, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": quantization}))
    with pytest.raises(ValueError, match=rf"config\.json: .*{message}"):
        import_checkpoint(tmp_path)


def test_a_directory_without_config_json_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"config\.json: missing"):
        import_checkpoint(tmp_path)


def test_an_mxfp8_plan_is_refused_on_export(tmp_path):
    from nibble.interop import QuantizedCheckpoint

    state = {
        "m.weight::elements": torch.zeros(4, 32, dtype=torch.float8_e4m3fn),
        "m.weight::block_scales": torch.zeros(4, 1),
    }
    with pytest.raises(ValueError, match="only NVFP4"):
        export_checkpoint(QuantizedCheckpoint(state), tmp_path / "o", "modelopt")
    assert not (tmp_path / "o").exists()


def test_dense_exports_share_one_scale_per_pair_and_warn_only_when_they_do_not(dense, tmp_path, caplog):
    from tests.nibble.interop.conftest import DENSE, quantized

    pair = [f"model.layers.0.mlp.{p}.weight_scale_2" for p in ("gate_proj", "up_proj")]
    with caplog.at_level("WARNING", logger="nibble.interop.checkpoint"):
        out = export_checkpoint(dense, tmp_path / "shared", "modelopt")
    assert not caplog.records
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor(pair[0]), f.get_tensor(pair[1]))  # what a fused gate_up_proj decodes with
    separate = quantized(DENSE, dense.plan.model_copy(update={"gate_up_global_scale": "separate"}), seed=1)
    with caplog.at_level("WARNING", logger="nibble.interop.checkpoint"):
        export_checkpoint(separate, tmp_path / "separate", "modelopt")
    assert "gate_up_global_scale: shared" in caplog.text


def test_a_plan_that_claims_a_shared_scale_its_tensors_lack_is_named(dense, tmp_path):
    from tests.nibble.interop.conftest import DENSE, quantized

    separate = quantized(DENSE, dense.plan.model_copy(update={"gate_up_global_scale": "separate"}), seed=1)
    out = export_checkpoint(separate, tmp_path / "out", "compressed-tensors")
    plan = json.loads((out / "nibble_plan.json").read_text())
    (out / "nibble_plan.json").write_text(json.dumps({**plan, "gate_up_global_scale": "shared"}))
    with pytest.raises(ValueError, match=r"nibble_plan\.json: gate_up_global_scale is 'shared' but model\.layers\.0"):
        import_checkpoint(out)
    # an export written before the field existed: each projection had its own scale
    del plan["gate_up_global_scale"]
    (out / "nibble_plan.json").write_text(json.dumps(plan))
    assert import_checkpoint(out).plan.gate_up_global_scale == "separate"
    (out / "nibble_plan.json").write_text(json.dumps({**plan, "format": "nvfp5"}))
    with pytest.raises(ValueError, match=r"nibble_plan\.json: not a precision plan"):
        import_checkpoint(out)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_layers": 5}, r"num_layers=5, but config\.json has num_hidden_layers=3"),
        ({"format": "bf16"}, r"model\.layers\.0\.mlp\.\w+_proj is stored in NVFP4, but the plan gives it another"),
        (
            {"bf16_last_fraction": 0.0},
            r"the plan puts model\.layers\.2\.mlp\.\w+_proj\.weight in NVFP4, but it is stored",
        ),
        ({"gate_up_global_scale": "both"}, r"not a precision plan: gate_up_global_scale: Input should be"),
    ],
)
def test_a_plan_that_contradicts_its_tensors_is_named(change, message, dense, tmp_path):
    out = export_checkpoint(dense, tmp_path / "out", "modelopt")
    plan = json.loads((out / "nibble_plan.json").read_text())
    (out / "nibble_plan.json").write_text(json.dumps({**plan, **change}))
    with pytest.raises(ValueError, match=rf"nibble_plan\.json: {message}"):
        import_checkpoint(out)


def test_a_plan_path_that_is_a_directory_is_named(dense, tmp_path):
    out = export_checkpoint(dense, tmp_path / "out", "modelopt")
    (out / "nibble_plan.json").unlink()
    (out / "nibble_plan.json").mkdir()
    with pytest.raises(ValueError, match=r"nibble_plan\.json: not a file"):
        import_checkpoint(out)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tensors_the_model_config_cannot_load_are_refused_at_import(layout, dense, tmp_path):
    packed, block, _ = NAMES[layout]
    up = "model.layers.0.mlp.up_proj"

    def halve_up(tensors):
        for suffix in (packed, block):
            tensors[f"{up}.{suffix}"] = tensors[f"{up}.{suffix}"][:48].clone()

    out = exported(dense, tmp_path, layout, halve_up)
    with pytest.raises(
        ValueError, match=rf"config\.json: tensor {up}\.weight has shape \(48, 64\), config\.json implies"
    ):
        import_checkpoint(out)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_global_scale_that_is_not_positive_and_finite_is_named(layout, value, dense, tmp_path):
    global_ = NAMES[layout][2]
    down = "model.layers.0.mlp.down_proj"

    def spoil(tensors):
        tensors[f"{down}.{global_}"] = torch.full_like(tensors[f"{down}.{global_}"], value)

    out = exported(dense, tmp_path, layout, spoil)
    with pytest.raises(ValueError, match=rf"{down}\.{global_} is .*not a positive finite global scale"):
        import_checkpoint(out)


def test_a_modelopt_group_size_other_than_16_is_named(dense, tmp_path):
    out = export_checkpoint(dense, tmp_path / "out", "modelopt")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["group_size"] = 32
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: ModelOpt group_size 32"):
        import_checkpoint(out)


def test_an_output_that_holds_the_source_is_refused_even_with_overwrite(dense, tmp_path):
    source = export_checkpoint(dense, tmp_path / "parent" / "ct", "compressed-tensors")
    checkpoint = import_checkpoint(source)
    (source.parent / "config.json").write_text("{}")  # the parent looks like a checkpoint --overwrite may replace
    for out in (source, source.parent):
        with pytest.raises(ValueError, match="must not be the source or a folder holding it"):
            write_dequantized(checkpoint, out, tokenizer_from=source, overwrite=True)
    assert (source / "model.safetensors").is_file()


def test_a_model_config_nibble_cannot_read_is_named_with_its_file(dense, tmp_path):
    out = export_checkpoint(dense, tmp_path / "out", "compressed-tensors")
    config = json.loads((out / "config.json").read_text())
    del config["vocab_size"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: .*vocab_size"):
        import_checkpoint(out)
