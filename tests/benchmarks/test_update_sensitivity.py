"""The update-sensitivity benchmark on the tiny CPU warm start: what it records, its weight-change count,
and the inputs it refuses."""

import json

import pytest
import torch

from benchmarks.update_sensitivity import changed, main


def test_changed_counts_e2m1_codes_per_nibble_scales_per_block_and_tensor_and_bf16_elements():
    e4m3 = torch.float8_e4m3fn
    before = {
        "w::codes": torch.tensor([0x12, 0x34], dtype=torch.uint8),
        "w::block_scales": torch.tensor([1.0, 2.0, 3.0, 4.0]).to(e4m3),
        "w::global_scale": torch.tensor(0.5),
        "v.weight": torch.ones(2, 2, dtype=torch.bfloat16),
        "norm.weight": torch.ones(4, dtype=torch.bfloat16),
    }
    after = {
        "w::codes": torch.tensor([0x13, 0x43], dtype=torch.uint8),  # one nibble, then both
        "w::block_scales": torch.tensor([1.0, 2.0, 3.0, 5.0]).to(e4m3),
        "w::global_scale": torch.tensor(0.25),
        "v.weight": torch.tensor([[1.0, 1.0], [1.0, 2.0]], dtype=torch.bfloat16),
        "norm.weight": torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.bfloat16),
    }
    assert changed(before, after) == {"codes": 3 / 4, "block_scales": 1 / 4, "global_scale": 1.0, "bf16": 2 / 8}
    assert changed(before, before) == {"codes": 0.0, "block_scales": 0.0, "global_scale": 0.0, "bf16": 0.0}
    signed_zero = {"w::codes": torch.tensor([0x80], dtype=torch.uint8)}  # −0 in the high nibble is still 0
    assert changed({"w::codes": torch.tensor([0x00], dtype=torch.uint8)}, signed_zero)["codes"] == 0.0
    bf16_only = {"v.weight": before["v.weight"]}
    assert changed(bf16_only, bf16_only)["codes"] is None


@pytest.fixture
def config(warm_start, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        f"model: {{checkpoint: {warm_start}}}\n"
        "task: {name: addition, options: {digits: 3, eval_size: 16}}\n"
        "plan: {quantize: all_linear}\n"
        "trainer: {learning_rate: 1.0e-3}\n"
    )
    return path


def test_records_bf16_first_then_each_plan_with_a_deterministic_forward(config, tmp_path, capsys):
    out = tmp_path / "sensitivity.json"
    assert main(["--config", str(config), "--steps", "2", "--sequences", "3", "--max-new-tokens", "6",
                 "--variants", "nvfp4_token", "--out", str(out)]) == 0  # fmt: skip
    record = json.loads(out.read_text())
    assert record["benchmark"] == "update_sensitivity" and record["learning_rate"] == 1e-3
    bf16, token = record["variants"]
    assert (bf16["variant"], token["variant"]) == ("bf16", "nvfp4_token")
    assert bf16["repeat_max_abs_diff"] == 0.0 and token["repeat_max_abs_diff"] == 0.0
    assert bf16["precision_noise"] is None and token["precision_noise"] > 0
    assert [s["step"] for s in token["steps"]] == [1, 2] and bf16["tokens"] == token["tokens"] > 0
    assert bf16["tokens"] == sum(record["response_tokens"]) and len(record["response_tokens"]) == 3
    # a step moves BF16's weights and its logprobs
    assert bf16["steps"][0]["bf16"] > 0 and bf16["steps"][0]["logprob_abs_diff"] > 0
    assert bf16["steps"][0]["codes"] is None and 0 <= token["steps"][0]["codes"] <= 1
    assert "nvfp4_token" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--learning-rate", "nan"], "--learning-rate nan"),
        (["--learning-rate=-1e-5"], "--learning-rate -1e-05"),
        (["--steps", "0"], "--steps: '0' is not a positive integer"),
        (["--max-new-tokens", "x"], "--max-new-tokens: 'x' is not a positive integer"),
    ],
)
def test_bad_numbers_exit_2_naming_the_option(config, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--out", str(tmp_path / "o.json"), *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_an_existing_out_is_never_overwritten(config, tmp_path, capsys):
    out = tmp_path / "kept.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--out", str(out)])
    assert exit_info.value.code == 2 and "exists" in capsys.readouterr().err and out.read_text() == "{}"


def test_an_out_that_cannot_be_written_is_refused_before_any_work(config, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--out", str(blocker / "o.json")])
    assert exit_info.value.code == 2 and "cannot write there" in capsys.readouterr().err


@pytest.mark.parametrize("update, frozen", [("quantised", "bf16"), ("bf16", "codes")])
def test_update_moves_only_the_named_parameters(config, tmp_path, update, frozen):
    out = tmp_path / "ablation.json"
    main(["--config", str(config), "--steps", "1", "--sequences", "2", "--max-new-tokens", "4",
          "--variants", "nvfp4_token", "--update", update, "--out", str(out)])  # fmt: skip
    bf16, token = json.loads(out.read_text())["variants"]
    assert bf16["update"] == "all" and token["update"] == update  # BF16's movement stays the yardstick
    moved = "codes" if frozen == "bf16" else "bf16"
    assert token["steps"][0][frozen] == 0.0 and token["steps"][0][moved] > 0


def test_a_config_without_its_model_is_refused_before_anything_is_made(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{checkpoint: {tmp_path / 'absent'}}}\ntask: {{name: addition}}\n")
    out = tmp_path / "new" / "o.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--out", str(out)])
    assert exit_info.value.code == 2
    assert f"model.checkpoint {tmp_path / 'absent'} holds no model" in capsys.readouterr().err
    assert not out.parent.exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: (d / "config.json").write_text("{}"), "config.json"),  # a config that names no model
        (lambda d: (d / "config.json").write_text('{"model_type": "llama"}'), "config.json"),
        (lambda d: None, "holds no model (no config.json)"),
    ],
)
def test_a_checkpoint_that_is_not_a_whole_model_is_refused_before_anything_is_made(tmp_path, capsys, make, message):
    checkpoint = tmp_path / "model"
    checkpoint.mkdir()
    make(checkpoint)
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{checkpoint: {checkpoint}}}\ntask: {{name: addition}}\n")
    out = tmp_path / "new" / "o.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--out", str(out)])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not out.parent.exists()


def test_a_checkpoint_without_weights_and_a_device_this_machine_lacks_are_refused(warm_start, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{checkpoint: {warm_start}}}\ntask: {{name: addition}}\n")
    out = tmp_path / "new" / "o.json"
    for device, message in [("bogus", "--device bogus: 'bogus' is not a device"), ("cuda:64", "--device cuda:64")]:
        with pytest.raises(SystemExit) as exit_info:
            main(["--config", str(config), "--device", device, "--out", str(out)])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text((warm_start / "config.json").read_text())
    config.write_text(f"model: {{checkpoint: {weightless}}}\ntask: {{name: addition}}\n")
    with pytest.raises(SystemExit):
        main(["--config", str(config), "--out", str(out)])
    assert "holds no weights (*.safetensors)" in capsys.readouterr().err
    assert not out.parent.exists()


def test_an_unusable_out_path_is_refused_by_name(config, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--out", str(tmp_path / ("a" * 300 + ".json"))])
    assert exit_info.value.code == 2 and "--out" in capsys.readouterr().err
