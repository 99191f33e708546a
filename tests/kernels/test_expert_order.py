"""The MoE routing order in one launch (:mod:`nibble.kernels.gpu.expert_order`) against
``torch.argsort(stable=True)`` and its gathers, every integer. On the CPU under Triton's interpreter; the
``gpu`` tests repeat it compiled at decode and prefill sizes and through the MoE layer's dispatch.
"""

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu.expert_order import MAX_SLOTS, expert_order  # imports triton, hence after the skip
from nibble.recipe import modules

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(top_k_index: torch.Tensor) -> None:
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    want = (order, flat[order], order // top_k_index.shape[1])
    got = expert_order(top_k_index.to(DEVICE))
    for name, g, w in zip(("order", "experts", "token"), got, want, strict=True):
        assert g.dtype == torch.int64 and torch.equal(g.cpu(), w), name


def _routing(tokens: int, top_k: int, experts: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices


@pytest.mark.parametrize("tokens,top_k,experts", [(64, 8, 128), (37, 2, 16), (5, 1, 3), (1, 16, 16), (200, 3, 7)])
def test_equals_torch_stable_argsort(tokens, top_k, experts):
    _check(_routing(tokens, top_k, experts, tokens))


def test_ties_keep_slot_order_and_any_int64_sorts():
    gen = torch.Generator().manual_seed(1)
    _check(torch.randint(0, 3, (50, 4), generator=gen))  # many slots on one expert: the stable order matters
    _check(torch.tensor([[2**62, -(2**62)], [-1, 0], [2**62, -1]]))  # not expert ids, still argsort's order
    _check(torch.zeros((9, 2), dtype=torch.int64))


def test_no_slots():
    assert all(t.shape == (0,) for t in expert_order(torch.zeros((0, 8), dtype=torch.int64, device=DEVICE)))


@pytest.mark.parametrize(
    "top_k_index,match",
    [
        (torch.zeros(4, 2, dtype=torch.int32), "int64 top_k_index"),
        (torch.zeros(8, dtype=torch.int64), r"top_k_index \[N, k\]"),
        ([[0, 1]], r"top_k_index \[N, k\]"),
        (torch.zeros(4, 0, dtype=torch.int64), "k >= 1"),
    ],
)
def test_rejects_bad_arguments(top_k_index, match):
    with pytest.raises(ValueError, match=match):
        expert_order(top_k_index)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        expert_order(torch.zeros(4, 2, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, MAX_SLOTS // 8, 4096])
def test_decode_and_prefill_sized_on_cuda(tokens):
    _check(_routing(tokens, 8, 128, tokens))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [64, MAX_SLOTS // 8 + 1])
def test_the_moe_layers_dispatch_either_side_of_the_crossover(tokens):
    top_k_index = _routing(tokens, 8, 128, 3).cuda()
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    for got, want in zip(modules.expert_order(top_k_index), (order, flat[order], order // 8), strict=True):
        assert torch.equal(got, want)
