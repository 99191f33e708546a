"""Quantised models in weight-sync's form: a Qwen-MoE-shaped tiny model with a BF16 tail layer, and a dense
Llama with tied embeddings whose MLPs are NVFP4 (``all_linear``)."""

from __future__ import annotations

import pytest
import torch

from nibble.interop import QuantizedCheckpoint
from nibble.model import ModelConfig, MoETransformer, tiny
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state, quantize_state
from tests.helpers import TINY_LLAMA

DENSE = TINY_LLAMA


def quantized(config: ModelConfig, plan: PrecisionPlan, seed: int = 0) -> QuantizedCheckpoint:
    torch.manual_seed(seed)
    state = quantize_state(published_state(MoETransformer(config, plan)), plan)
    return QuantizedCheckpoint(state, config.to_hf(), plan)


@pytest.fixture(scope="session")
def moe() -> QuantizedCheckpoint:
    config = tiny(vocab_size=32)
    return quantized(config, PrecisionPlan(num_layers=config.num_hidden_layers, bf16_last_fraction=0.25))


@pytest.fixture(scope="session")
def dense() -> QuantizedCheckpoint:
    plan = PrecisionPlan(num_layers=3, quantize="all_linear", bf16_last_fraction=0.34, four_over_six=None)
    return quantized(DENSE, plan, seed=1)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so float comparisons see −0.0 and NaN payloads and float8 compares at all."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_same_state(sut: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert sorted(sut) == sorted(ref)
    for name, tensor in ref.items():
        assert sut[name].dtype == tensor.dtype and sut[name].shape == tensor.shape, name
        assert torch.equal(bits(sut[name]), bits(tensor)), name
