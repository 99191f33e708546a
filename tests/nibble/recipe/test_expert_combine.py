"""The MoE combine (:func:`nibble.recipe.modules.combine_in_expert_order`): each token's weighted expert
outputs summed in float32 in ascending expert order and rounded once — the CPU's ``index_add`` bit for bit,
with its gradient, and on CUDA the same bits as on the CPU (CUDA's ``index_add`` adds with atomics, in
thread order)."""

import pytest
import torch

from nibble.recipe.modules import combine_in_expert_order
from tests.helpers import assert_same_bits, expert_routing, heavy_tailed


@pytest.mark.parametrize("top_k,repeats", [(1, False), (2, False), (3, False), (8, False), (16, False), (8, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_equals_the_cpus_index_add_with_its_gradient(top_k, repeats, dtype):
    weighted, top_i, order = expert_routing(37, top_k, 16, 24, dtype, top_k, repeats)
    weighted[::5, 3] = -0.0  # signed zeros: -0 + -0 stays -0, -0 + 0 does not
    token = order // top_k
    grad = heavy_tailed((37, 24), 99).to(dtype)
    old = weighted.clone().requires_grad_(True)
    reference = torch.zeros((37, 24), dtype=dtype).index_add(0, token, old)
    reference.backward(grad)
    new = weighted.clone().requires_grad_(True)
    combined = combine_in_expert_order(new, top_i, order)
    combined.backward(grad)
    assert_same_bits(reference.detach(), combined.detach(), f"top_k={top_k}")
    assert_same_bits(old.grad, new.grad, f"gradient, top_k={top_k}")


def test_no_tokens():
    no_slots = torch.zeros((0, 4), dtype=torch.int64)
    out = combine_in_expert_order(torch.zeros((0, 5)), no_slots, no_slots.reshape(-1))
    assert out.shape == (0, 5)


def test_non_finite_contributions_stay_in_their_token():
    weighted, top_i, order = expert_routing(6, 4, 8, 3, torch.bfloat16, 2)
    weighted[0, 0], weighted[1, 1] = float("nan"), float("inf")
    token = order // 4
    reference = torch.zeros((6, 3), dtype=torch.bfloat16).index_add(0, token, weighted)
    combined = combine_in_expert_order(weighted, top_i, order)
    assert torch.equal(reference.isnan(), combined.isnan())  # which NaN comes out is the hardware's
    finite = ~reference.isnan()
    assert_same_bits(reference[finite], combined[finite], "non-finite")


@pytest.mark.gpu
def test_on_cuda_the_cpus_bits_every_time():
    # Qwen3-30B-A3B's decode: 64 tokens, 8 of 128 experts, hidden 2048
    weighted, top_i, order = expert_routing(64, 8, 128, 2048, torch.bfloat16, 3)
    weighted[::7, ::3] = -0.0
    cpu = combine_in_expert_order(weighted, top_i, order)
    on_cuda = (weighted.cuda(), top_i.cuda(), order.cuda())
    for _ in range(20):
        assert_same_bits(cpu, combine_in_expert_order(*on_cuda).cpu(), "CUDA combine")
    # operands the kernel does not take (an int32 index) stay with the composition: the same bits
    int32_index = (on_cuda[0], on_cuda[1].to(torch.int32), on_cuda[2])
    assert_same_bits(cpu, combine_in_expert_order(*int32_index).cpu(), "CUDA combine, int32 index")
