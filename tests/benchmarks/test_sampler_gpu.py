"""The sampler benchmark's CPU-checkable parts: the resident expert bytes it reports, and its exit
without CUDA (the timing itself needs the GPU)."""

import copy
import subprocess
import sys

import pytest
import torch

from benchmarks.sampler_gpu import expert_bytes
from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan


def packed(fmt: str) -> MoETransformer:
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers, format=fmt, bf16_last_fraction=0.0)
    return copy.deepcopy(MoETransformer(config, plan)).pack()


def test_expert_bytes_are_bf16_stacks_or_nvfp4_codes_and_scales():
    config = tiny(vocab_size=32)
    per_layer = config.num_experts * 3 * config.moe_intermediate_size * config.hidden_size  # gate, up, down
    assert expert_bytes(packed("bf16")) == config.num_hidden_layers * per_layer * 2
    # half a byte per element, one E4M3 scale per 16, one float32 global scale per expert projection
    nvfp4 = config.num_hidden_layers * (per_layer // 2 + per_layer // 16 + 2 * config.num_experts * 4)
    assert expert_bytes(packed("nvfp4")) == nvfp4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_without_cuda_the_benchmark_exits_with_a_reason():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.sampler_gpu", "--layers", "1"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "needs a CUDA GPU" in result.stderr
