"""The MoE combine in one launch (:mod:`nibble.kernels.gpu.expert_combine`) against the CPU's ``index_add``
(float32 accumulation from zero in ascending expert order, one rounding), every bit. On the CPU under
Triton's interpreter; the ``gpu`` test repeats it compiled at decode and prefill sizes.
"""

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu.expert_combine import expert_combine  # imports triton, hence after the skip
from tests.helpers import assert_same_bits, expert_routing

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _routing(tokens: int, top_k: int, experts: int, hidden: int, dtype: torch.dtype, seed: int, repeats=False):
    weighted, top_i, order = expert_routing(tokens, top_k, experts, hidden, dtype, seed, repeats)
    weighted[::5, ::3] = -0.0  # signed zeros: -0 + -0 stays -0, +0 + -0 does not
    weighted[order // top_k == 0] = -0.0  # token 0 all -0: the sum from +0 is +0
    return weighted, top_i, order


def _index_add(weighted: torch.Tensor, top_i: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    token = order // top_i.shape[1]
    return torch.zeros((top_i.shape[0], weighted.shape[1]), dtype=weighted.dtype).index_add(0, token, weighted)


def _check(weighted: torch.Tensor, top_i: torch.Tensor, order: torch.Tensor, what: str) -> None:
    got = expert_combine(*(t.to(DEVICE) for t in (weighted, top_i, order)))
    assert got.dtype == weighted.dtype and got.shape == (top_i.shape[0], weighted.shape[1])
    assert_same_bits(_index_add(weighted, top_i, order), got.cpu(), what)


@pytest.mark.parametrize("top_k,repeats", [(1, False), (2, False), (3, False), (8, False), (16, False), (8, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_equals_the_cpus_index_add(top_k, repeats, dtype):
    _check(*_routing(37, top_k, 16, 24, dtype, top_k, repeats), f"top_k={top_k} {dtype}")


def test_the_sum_runs_in_ascending_expert_order():
    # one token, experts 5, 1, 3: ascending (1, 3, 5) adds 2^24 + 1 (rounds to 2^24) then -2^24 -> 0;
    # any order that adds -2^24 before the 1 gives 1
    top_i = torch.tensor([[5, 1, 3]])
    order = torch.argsort(top_i.reshape(-1), stable=True)  # rows: expert 1, 3, 5
    weighted = torch.tensor([[2.0**24], [1.0], [-(2.0**24)]])
    got = expert_combine(*(t.to(DEVICE) for t in (weighted, top_i, order)))
    assert got.item() == 0.0
    assert_same_bits(_index_add(weighted, top_i, order), got.cpu(), "order")


def test_a_token_of_negative_zeros_sums_to_positive_zero():
    weighted, top_i, order = _routing(5, 8, 16, 24, torch.bfloat16, 4)
    got = expert_combine(*(t.to(DEVICE) for t in (weighted, top_i, order)))
    assert not got[0].view(torch.int16).any()  # +0 bits: accumulated from +0, as index_add into zeros


def test_non_contiguous_operands():
    weighted, top_i, order = _routing(9, 4, 16, 40, torch.float32, 6)
    strided = torch.empty(weighted.shape[0], 2 * weighted.shape[1])[:, ::2]
    strided.copy_(weighted)
    index_t = top_i.t().contiguous().t()  # column-major [N, k]
    order_strided = torch.stack([order, order], 1)[:, 0]
    got = expert_combine(*(t.to(DEVICE) for t in (strided, index_t, order_strided)))
    assert_same_bits(_index_add(weighted, top_i, order), got.cpu(), "non-contiguous")


def test_an_order_that_is_not_the_stable_argsort_reads_only_inside_weighted():
    # ties reversed (what a non-stable sort may return) and an entry out of range: wrong rows, finite sums
    weighted, top_i, order = _routing(50, 8, 6, 16, torch.float32, 7, repeats=True)
    flat = top_i.reshape(-1)
    unstable = torch.argsort(flat * flat.numel() + (flat.numel() - 1 - torch.arange(flat.numel())))
    broken = order.clone()
    broken[3] = 10**6
    for bad in (unstable, broken):
        got = expert_combine(*(t.to(DEVICE) for t in (weighted.abs(), top_i, bad)))
        assert torch.isfinite(got).all() and got.max() <= weighted.abs().max() * 8


def test_hidden_past_one_column_block_and_bf16_rounding():
    # 1030 columns: two column programs, the second nearly empty; float32-only sums round to bf16 once
    weighted, top_i, order = _routing(3, 4, 6, 1030, torch.bfloat16, 5)
    weighted[:, 7] = torch.tensor([1.0, 2.0**-8, 2.0**-9, 2.0**-9] * 3, dtype=torch.bfloat16)
    _check(weighted, top_i, order, "1030 columns")


def test_no_tokens_or_no_columns():
    empty = torch.zeros((0, 4), dtype=torch.int64)
    assert expert_combine(torch.zeros((0, 5), device=DEVICE), empty.to(DEVICE), empty[:, 0].to(DEVICE)).shape == (0, 5)
    top_i = torch.tensor([[0, 1]], device=DEVICE)
    assert expert_combine(torch.zeros((2, 0), device=DEVICE), top_i, top_i[0]).shape == (1, 0)


@pytest.mark.parametrize(
    "weighted,top_i,order,match",
    [
        (torch.zeros(4, 3, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int64), torch.arange(4), "weighted"),
        (torch.zeros(4), torch.zeros(2, 2, dtype=torch.int64), torch.arange(4), r"weighted \[N\*k, H\]"),
        (torch.zeros(4, 3), torch.zeros(4, 0, dtype=torch.int64), torch.arange(0), "k >= 1"),
        (torch.zeros(4, 3), torch.zeros(2, 2, dtype=torch.int32), torch.arange(4), "top_k_index int64"),
        (torch.zeros(4, 3), torch.zeros(2, 2, dtype=torch.int64), torch.arange(4.0), "order int64"),
        (torch.zeros(4, 3), torch.zeros(2, 2, dtype=torch.int64), torch.arange(3), r"order \[N\*k\]"),
        (torch.zeros(5, 3), torch.zeros(2, 2, dtype=torch.int64), torch.arange(4), r"order \[N\*k\]"),
        ([[0.0]], torch.zeros(1, 1, dtype=torch.int64), torch.arange(1), "weighted a torch.Tensor"),
        (torch.zeros(1, 3), [[0]], torch.arange(1), "top_k_index a torch.Tensor"),
        (torch.zeros(1, 3), torch.zeros(1, 1, dtype=torch.int64), [0], "order a torch.Tensor"),
    ],
)
def test_rejects_bad_arguments(weighted, top_i, order, match):
    with pytest.raises(ValueError, match=match):
        expert_combine(weighted, top_i, order)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        expert_combine(torch.zeros(4, 3), torch.zeros(2, 2, dtype=torch.int64), torch.arange(4))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [64, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_and_prefill_sized_on_cuda(tokens, dtype):
    # Qwen3-30B-A3B: 8 of 128 experts, hidden 2048
    _check(*_routing(tokens, 8, 128, 2048, dtype, tokens), f"{tokens} tokens {dtype}")
