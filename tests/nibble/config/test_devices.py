"""Placement: the ``device`` settings, what the launcher gives each child, and the checks before a run."""

import pytest
import torch

from nibble.config import RunConfig, devices, load
from nibble.launcher import check_devices


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:7"])
def test_accepted_devices(device):
    assert RunConfig.model_validate({"sampler": {"device": device}, "trainer": {"device": device}})


@pytest.mark.parametrize("device", ["tpu", "CUDA", "cuda:", "cuda:01", "cuda:-1", "mps", ""])
def test_a_bad_device_is_named(tmp_path, device):
    path = tmp_path / "run.yaml"
    path.write_text(f"sampler: {{device: '{device}'}}\n")
    with pytest.raises(ValueError, match=r"sampler\.device: .*is not a device: use cpu, cuda or cuda:N"):
        load(path)


def test_auto_compute_dtype_resolves_from_the_trainers_device_on_every_service():
    from nibble.recipe import PrecisionPlan

    mixed = RunConfig.model_validate({"trainer": {"device": "cuda"}, "sampler": {"device": "cpu"}})
    assert mixed.plan_device == "cuda"  # a CPU sampler of a CUDA trainer computes in bfloat16 too
    assert PrecisionPlan.from_config(mixed.plan, 4, mixed.plan_device).compute_dtype == "bfloat16"
    cpu = RunConfig.model_validate({"sampler": {"device": "cuda"}})
    assert PrecisionPlan.from_config(cpu.plan, 4, cpu.plan_device).compute_dtype == "float32"


def test_shares_of_one_gpu_must_fit_and_other_gpus_are_counted_apart():
    shared = {
        "num_samplers": 2,
        "trainer": {"device": "cuda:0", "gpu_memory_fraction": 0.5},
        "sampler": {"device": "cuda:0", "gpu_memory_fraction": 0.3},
    }
    with pytest.raises(ValueError, match=r"GPU 0 is promised 1\.10 of its memory"):
        RunConfig.model_validate(shared)
    shared["sampler"]["device"] = "cuda:1"  # the samplers on their own GPU: 0.5 and 0.6
    assert RunConfig.model_validate(shared).sampler.device == "cuda:1"
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        RunConfig.model_validate({"sampler": {"gpu_memory_fraction": 1.5}})


def test_torchrun_ranks_take_cuda_not_one_named_gpu():
    with pytest.raises(ValueError, match="torchrun gives each rank its GPU"):
        RunConfig.model_validate({"trainer": {"device": "cuda:1", "nproc_per_node": 2}, "sampler": {"device": "cuda"}})


def test_the_launcher_makes_gpu_n_the_childs_only_one():
    assert devices.child_environment("cuda:3") == {"CUDA_VISIBLE_DEVICES": "3"}
    assert devices.child_environment("cuda") == {}
    assert devices.child_environment("cpu") == {}
    assert [devices.gpu_index(d) for d in ("cpu", "cuda", "cuda:2")] == [None, 0, 2]


def test_the_gpu_config_is_valid_and_shares_gpu_0():
    config = load("configs/gpu.yaml")
    assert (config.trainer.device, config.sampler.device) == ("cuda:0", "cuda:0")
    assert config.trainer.gpu_memory_fraction + config.num_samplers * config.sampler.gpu_memory_fraction <= 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals on a machine without CUDA")
def test_without_cuda_a_gpu_run_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match=r"sampler\.device=cuda:0 but this machine has 0 GPU"):
        check_devices(RunConfig.model_validate({"sampler": {"device": "cuda:0"}}))
    with pytest.raises(ValueError, match=r"trainer\.device=cuda:0 with trainer.nproc_per_node=1 needs"):
        check_devices(load("configs/gpu.yaml"))
    with pytest.raises(ValueError, match=r"sampler\.device=cuda but no CUDA GPU is visible"):
        devices.resolve("sampler.device", "cuda")
    assert devices.resolve("sampler.device", "cpu") == torch.device("cpu")
