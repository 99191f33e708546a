"""The vendor grouped GEMM wrapper: one launch equals one matmul per expert, empty experts included."""

import pytest
import torch

from nibble.kernels.gpu import grouped

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def routed_rows(rows: int, num_experts: int) -> torch.Tensor:
    """Sorted expert ids ``[rows]`` that leave experts 0 and 3 without rows."""
    experts = torch.randint(0, num_experts, (rows,), generator=torch.Generator().manual_seed(0))
    experts = torch.where((experts == 0) | (experts == 3), torch.ones_like(experts), experts)
    return experts.sort().values.to(DEVICE)


def test_expert_counts_counts_every_expert():
    experts = routed_rows(40, 6)
    counts = grouped.expert_counts(experts, 6)
    assert counts.tolist() == [int((experts == e).sum()) for e in range(6)]
    assert counts[0] == counts[3] == 0


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this PyTorch has no torch._grouped_mm")
def test_grouped_mm_equals_one_matmul_per_expert():
    # On the CPU PyTorch runs its reference loop: what this checks there is the wrapper (weight layout,
    # offsets); on CUDA, PyTorch's grouped kernel too.
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)
    w = torch.randn(6, 48, 32, generator=torch.Generator().manual_seed(2)).to(DEVICE, torch.bfloat16)
    experts = routed_rows(40, 6)
    out = grouped.grouped_mm(x, w, experts)
    ref = torch.stack([x[r].float() @ w[experts[r]].float().T for r in range(40)])
    assert out.dtype == torch.bfloat16 and out.shape == (40, 48)
    # float32 accumulation in either order, one bf16 rounding of the result: within one bf16 ulp
    torch.testing.assert_close(out.float(), ref, atol=0, rtol=2**-8)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this PyTorch has no torch._grouped_mm")
def test_grouped_backward_gemms_equal_one_matmul_per_expert():
    # The trainer's backward launches: dgrad[r] = dy[r] @ W[e(r)], wgrad[e] = dy[rows of e].T @ x[rows of e],
    # zeros for the experts without rows (0 and 3). Same tolerance as above: one bf16 rounding.
    dy = torch.randn(40, 48, generator=torch.Generator().manual_seed(3)).to(DEVICE, torch.bfloat16)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)
    w = torch.randn(6, 48, 32, generator=torch.Generator().manual_seed(2)).to(DEVICE, torch.bfloat16)
    experts = routed_rows(40, 6)
    dgrad = grouped.grouped_mm_dgrad(dy, w, experts)
    dgrad_ref = torch.stack([dy[r].float() @ w[experts[r]].float() for r in range(40)])
    torch.testing.assert_close(dgrad.float(), dgrad_ref, atol=0, rtol=2**-8)
    wgrad = grouped.grouped_mm_wgrad(dy, x, experts, 6)
    wgrad_ref = torch.stack([dy[experts == e].float().T @ x[experts == e].float() for e in range(6)])
    assert wgrad.shape == (6, 48, 32) and not wgrad[0].any() and not wgrad[3].any()
    torch.testing.assert_close(wgrad.float(), wgrad_ref, atol=1e-6, rtol=2**-8)


def test_grouped_path_is_cuda_bf16_only():
    assert not grouped.available(torch.device("cpu"), torch.bfloat16)
    assert not grouped.available(torch.device("cuda"), torch.float32)
