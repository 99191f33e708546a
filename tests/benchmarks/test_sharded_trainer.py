"""The sharded trainer benchmark's CPU-checkable parts: its FLOP formula against PyTorch's FLOP counter, its
refusals, and a run of the whole script on CPU processes (gloo) with a tiny model, profile included."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import sharded_trainer
from benchmarks.profile_summary import CATEGORIES
from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan


def test_projection_flops_equal_what_pytorch_counts_in_a_forward():
    config = tiny(vocab_size=64)
    model = MoETransformer(config, PrecisionPlan(num_layers=config.num_hidden_layers))
    length = 7
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(1, 64, (1, length)))
    # The counter sees the projections' matmuls (experts, router, shared expert, LM head) but not the CPU
    # attention kernel, so the formula's causal attention term is taken out before comparing.
    heads, dim, layers = config.num_attention_heads, config.head_dim, config.num_hidden_layers
    attention = 4 * heads * dim * layers * length * (length + 1) // 2
    assert counter.get_total_flops() == sharded_trainer.forward_flops(config, [length]) - attention


def test_spread_gives_median_quartiles_and_extremes():
    assert sharded_trainer.spread([4.0, 1.0, 3.0, 2.0, 5.0]) == {
        "median": 3.0,
        "q25": 2.0,
        "q75": 4.0,
        "min": 1.0,
        "max": 5.0,
    }


def test_more_gpus_than_the_machine_has_are_refused_by_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit, match="asks for 2 GPUs but this machine has 1 visible"):
        sharded_trainer.main(["--gpus", "1,2"])


def test_a_weak_scaling_batch_that_does_not_divide_is_refused(capsys):
    with pytest.raises(SystemExit):
        sharded_trainer.main(["--gpus", "2,3", "--groups", "1", "--device", "cpu"])
    assert "1.5 groups per step at 3 processes" in capsys.readouterr().err


def test_the_script_runs_on_cpu_processes_with_every_figure(tmp_path, capsys):
    out = tmp_path / "figures.json"
    tiny_run = ["--device", "cpu", "--model", "tiny", "--gpus", "1,2", "--groups", "2", "--group-size", "2"]
    tiny_run += ["--prompt-tokens", "4", "--response-tokens", "4", "--warmup", "0", "--steps", "2", "--threads", "1"]
    sharded_trainer.main([*tiny_run, "--profile", "--out", str(out)])
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert set(result["scaling_per_repeat"]) == {"strong_2_vs_1", "weak_2_vs_1"}
    assert all(len(r) == 2 for r in result["scaling_per_repeat"].values())  # --repeats defaults to 2
    two = result["runs"]["2"]
    assert two["groups_per_step"] == {"strong": 2, "weak": 4}
    for repeat in two["repeats"]["weak"]:
        assert len(repeat["step_seconds"]) == 2 and repeat["model_flops_per_step"] > 0
        assert repeat["mfu_per_gpu"] is None  # no peak for a CPU
    assert set(CATEGORIES) <= set(two["profile_seconds"]) and two["profile_seconds"]["fsdp_all_gather"] > 0
    assert "spread between repeats" in printed and "fsdp_reduce_scatter" in printed
