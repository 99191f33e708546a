"""``nibble export-checkpoint`` / ``import-checkpoint`` through the installed console script."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nibble.interop import dequantized_state, import_checkpoint
from nibble.model import MoETransformer, from_pretrained, tiny
from nibble.model.hf import save_pretrained
from nibble.recipe import PrecisionPlan

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def nibble(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NIBBLE, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = tiny(vocab_size=32)
    path = tmp_path_factory.mktemp("src") / "model"
    save_pretrained(MoETransformer(config, PrecisionPlan(num_layers=config.num_hidden_layers)), path)
    (path / "tokenizer.json").write_text("{}")
    return path


@pytest.mark.parametrize("layout", ["compressed-tensors", "modelopt"])
def test_export_under_the_run_plan_then_import_gives_nibbles_decoded_weights(layout, source, tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("plan:\n  four_over_six: mae\n")
    out = str(tmp_path / "q")
    done = nibble("export-checkpoint", str(source), "--out", out, "--format", layout, "--config", str(run))
    assert done.returncode == 0, done.stderr
    assert "NVFP4 weight tensors" in done.stdout and (tmp_path / "q" / "tokenizer.json").is_file()
    exported = import_checkpoint(tmp_path / "q")
    assert exported.plan.four_over_six == "mae"

    done = nibble("import-checkpoint", str(tmp_path / "q"), "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    model = from_pretrained(tmp_path / "d")
    ref = dequantized_state(exported)["model.layers.0.mlp.experts.2.down_proj.weight"]
    assert torch.equal(model.model.layers[0].mlp.experts.down_proj[2], ref)
    assert "quantization_config" not in json.loads((tmp_path / "d" / "config.json").read_text())


def test_importing_a_plain_checkpoint_exits_2_naming_config_json(source, tmp_path):
    done = nibble("import-checkpoint", str(source), "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert f"{source}/config.json: no quantization_config" in done.stderr
    assert not (tmp_path / "x").exists()


def test_an_unknown_format_is_refused(source, tmp_path):
    done = nibble("export-checkpoint", str(source), "--out", str(tmp_path / "q"), "--format", "gguf")
    assert done.returncode == 2 and "gguf" in done.stderr
