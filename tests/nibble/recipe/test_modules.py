"""Planned modules on CUDA: with autograd on or off, the experts run the same grouped kernels."""

import pytest
import torch

from nibble.recipe import PlannedExperts, PrecisionPlan


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_experts_with_and_without_gradients_compute_the_same_bits_on_cuda(fmt):
    torch.manual_seed(0)
    plan = PrecisionPlan(num_layers=1, format=fmt, compute_dtype="bfloat16", bf16_last_fraction=0.0)
    experts = PlannedExperts(8, 64, 32, fmt=fmt, plan=plan).cuda()
    x = torch.randn(24, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    top_w, top_i = torch.randn(24, 8, device="cuda").softmax(-1).topk(2)
    with torch.no_grad():
        pi_old = experts(x, top_i, top_w)
    pi_theta = experts(x, top_i, top_w)
    assert experts.runs_grouped() and torch.equal(pi_theta.detach(), pi_old)  # the first ratio is exactly 1
    pi_theta.float().square().sum().backward()
    assert all(torch.isfinite(g).all() for g in (x.grad, experts.gate_up_proj.grad, experts.down_proj.grad))
