"""What ``nibble run`` refuses before it trains a warm start or starts a service: options the task rejects,
a checkpoint that is a file or cannot be made by ``nibble sft``, and a quantised plan that quantises
nothing of a dense model."""

import pytest
import yaml

from nibble.config import RunConfig
from nibble.launcher import check_model_and_task
from tests.launcher.test_real_model_run import ROOT, tiny_smollm2


def smollm2_config(checkpoint, **changes) -> RunConfig:
    values = yaml.safe_load((ROOT / "configs" / "smollm2-gpu.yaml").read_text())
    values["model"]["checkpoint"] = str(checkpoint)
    values["task"]["options"].update(tokenizer=str(checkpoint), eval_size=8)
    values["sampler"].update(device="cpu", gpu_memory_fraction=None)
    values["trainer"].update(device="cpu", gpu_memory_fraction=None)
    for section, update in changes.items():
        values[section].update(update)
    return RunConfig.model_validate(values)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_smollm2(tmp_path_factory.mktemp("checks") / "smollm2-tiny")


def test_the_real_model_config_passes(checkpoint):
    check_model_and_task(smollm2_config(checkpoint))


@pytest.mark.parametrize(
    ("options", "named"),
    [({"dataset": "chain_sums"}, "chain_sums"), ({"held_out": "gsm9k"}, "gsm9k")],
)
def test_task_options_the_task_rejects_are_named_before_anything_starts(checkpoint, options, named):
    config = smollm2_config(checkpoint)
    config.task.options.update(options)
    with pytest.raises(ValueError, match=f"task 'reasoning_gym': .*{named}"):
        check_model_and_task(config)


def test_a_dense_model_with_an_experts_only_plan_is_refused(checkpoint):
    with pytest.raises(ValueError, match=r"plan\.quantize=experts quantises nothing .* dense llama"):
        check_model_and_task(smollm2_config(checkpoint, plan={"quantize": "experts"}))
    check_model_and_task(smollm2_config(checkpoint, plan={"quantize": "experts", "format": "bf16"}))


def test_a_missing_checkpoint_for_a_pretrained_tokenizer_is_refused_not_trained(checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"holds no checkpoint.*nibble import-model"):
        check_model_and_task(smollm2_config(checkpoint, model={"checkpoint": str(tmp_path / "missing")}))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="is a file, not a checkpoint directory"):
        check_model_and_task(smollm2_config(checkpoint, model={"checkpoint": str(gguf)}))


def test_the_default_run_may_still_train_its_warm_start(tmp_path):
    config = RunConfig.model_validate({"model": {"checkpoint": str(tmp_path / "warm_start")}})
    check_model_and_task(config)  # addition has its own vocabulary: nibble sft makes the checkpoint
