"""The real-model path of the main job on the CPU: ``configs/smollm2-gpu.yaml``'s run — reasoning-gym chain
sums in SmolLM2's chat template, the NVFP4 recipe over every MLP projection — with its devices set to the
CPU and a tiny random Llama of SmolLM2's layout (tied embeddings, SmolLM2's real tokenizer and chat
template) in place of the 135 M-parameter model. Real processes, a real redis-server, real gRPC."""

import gzip
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from nibble.model import MoETransformer, from_pretrained
from nibble.recipe import PrecisionPlan
from nibble.trainer.checkpoint import latest
from tests.helpers import TINY_LLAMA
from tests.services import run_launcher

ROOT = Path(__file__).resolve().parents[2]
NIBBLE = str(Path(sys.executable).with_name("nibble"))
TOKENIZER = ROOT / "tests" / "nibble" / "tasks" / "smollm2_tokenizer"
STEPS = 3


def tiny_smollm2(path: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's vocabulary, tied embeddings and tokenizer files, as
    ``nibble import-model`` lays a checkpoint out."""
    config = TINY_LLAMA.model_copy(
        update=dict(vocab_size=49152, num_hidden_layers=2, max_position_embeddings=512, rope_theta=100000.0)
    )
    torch.manual_seed(0)
    MoETransformer(config, PrecisionPlan(num_layers=2)).save_pretrained(path, dtype=torch.bfloat16)
    (path / "tokenizer.json").write_bytes(gzip.decompress((TOKENIZER / "tokenizer.json.gz").read_bytes()))
    shutil.copy(TOKENIZER / "tokenizer_config.json", path / "tokenizer_config.json")
    return path


@pytest.fixture(scope="module")
def real_model_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real_model")
    checkpoint = tiny_smollm2(tmp / "smollm2-tiny")
    config = yaml.safe_load((ROOT / "configs" / "smollm2-gpu.yaml").read_text())
    config["model"]["checkpoint"] = str(checkpoint)
    config["task"]["options"].update(tokenizer=str(checkpoint), eval_size=8, max_response_tokens=8)
    config["sampler"].update(device="cpu", gpu_memory_fraction=None, group_size=2, groups_per_batch=2)
    config["trainer"].update(
        device="cpu", gpu_memory_fraction=None, total_steps=STEPS, groups_per_step=2, eval_every=STEPS,
        checkpoint_every=1,
    )  # fmt: skip
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIBBLE_")}
    result = run_launcher([NIBBLE, "run", "--config", str(path), "--out", str(out)], timeout=600, env=env)
    return result, out, checkpoint


def test_the_real_model_config_runs_end_to_end_on_the_cpu(real_model_run):
    result, out, _ = real_model_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["weight_versions_published"] >= STEPS - 1
    assert summary["eval_accuracy_before"] is not None and summary["eval_accuracy_after"] is not None
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    fresh = [x["fresh_logprob_abs_diff"] for x in records if x.get("fresh_logprob_abs_diff") is not None]
    assert fresh and all(x == 0 for x in fresh), fresh  # π_old reproduces μ bit for bit at staleness 0
    for log in (out / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name


def test_the_trained_checkpoint_keeps_its_head_tied(real_model_run):
    result, out, checkpoint = real_model_run
    assert result.returncode == 0
    model = from_pretrained(latest(out / "trainer"))  # a run keeps its trainer checkpoints in its own folder
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config == from_pretrained(checkpoint).config
