"""The MoE combine (:func:`nibble.recipe.modules.combine_in_expert_order`): each token's weighted expert
outputs summed in ascending expert order, one rounding per add — the CPU's ``index_add`` bit for bit, and on
CUDA the same bits as on the CPU (CUDA's ``index_add`` adds with atomics, in thread order)."""

import pytest
import torch

from nibble.recipe.modules import combine_in_expert_order
from tests.helpers import assert_same_bits, heavy_tailed


def _routing(tokens: int, top_k: int, experts: int, hidden: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    top_i = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    flat = top_i.reshape(-1)
    order = torch.argsort(flat, stable=True)
    weighted = heavy_tailed((tokens * top_k, hidden), seed).to(dtype)  # rows sorted by expert
    return weighted, order


@pytest.mark.parametrize("top_k", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_equals_the_cpus_index_add(top_k, dtype):
    weighted, order = _routing(37, top_k, 16, 24, dtype, top_k)
    token = order // top_k
    reference = torch.zeros((37, 24), dtype=dtype).index_add(0, token, weighted)
    assert_same_bits(reference, combine_in_expert_order(weighted, order, top_k), f"top_k={top_k}")


def test_no_tokens():
    out = combine_in_expert_order(torch.zeros((0, 5)), torch.zeros(0, dtype=torch.int64), 4)
    assert out.shape == (0, 5)


def test_gradients_reach_every_contribution():
    weighted, order = _routing(5, 3, 8, 4, torch.float32, 1)
    weighted.requires_grad_(True)
    combine_in_expert_order(weighted, order, 3).sum().backward()
    assert torch.equal(weighted.grad, torch.ones_like(weighted))


@pytest.mark.gpu
def test_on_cuda_the_cpus_bits_every_time():
    # Qwen3-30B-A3B's decode: 64 tokens, 8 of 128 experts, hidden 2048
    weighted, order = _routing(64, 8, 128, 2048, torch.bfloat16, 3)
    cpu = combine_in_expert_order(weighted, order, 8)
    for _ in range(20):
        assert_same_bits(cpu, combine_in_expert_order(weighted.cuda(), order.cuda(), 8), "CUDA combine")
