"""Planned modules: the grouped no-grad expert path computes what the per-expert loop computes."""

import pytest
import torch

from nibble.recipe import PlannedExperts, PrecisionPlan


@pytest.mark.gpu
def test_bf16_experts_without_gradients_run_grouped_and_match_the_loop():
    torch.manual_seed(0)
    plan = PrecisionPlan(num_layers=1, format="bf16", compute_dtype="bfloat16")
    experts = PlannedExperts(8, 64, 32, fmt="bf16", plan=plan).cuda()
    x = torch.randn(24, 64, device="cuda", dtype=torch.bfloat16)
    top_w, top_i = torch.randn(24, 8, device="cuda").softmax(-1).topk(2)
    with torch.no_grad():
        assert experts._grouped_kernel_applies(x)
        grouped = experts(x, top_i, top_w)
    assert not experts._grouped_kernel_applies(x)  # trainer form with autograd on: the per-expert loop
    loop = experts(x, top_i, top_w).detach()
    # bf16 products accumulated in another order: agreement to a few bf16 roundings, as a relative norm
    assert (grouped.float() - loop.float()).norm() / loop.float().norm() < 1e-2
