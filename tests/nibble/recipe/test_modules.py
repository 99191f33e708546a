"""Planned modules on CUDA: with autograd on or off, and for one row or many, the experts give the same
bits (two and eight experts per token: with more than two the combine's order matters)."""

import pytest
import torch

from nibble.recipe import PlannedExperts, PrecisionPlan


def _grads(experts, x, top_i, top_w):
    x = x.detach().clone().requires_grad_()
    experts.zero_grad()
    y = experts(x, top_i, top_w)
    y.float().square().sum().backward()
    return y.detach(), x.grad, experts.gate_up_proj.grad.clone(), experts.down_proj.grad.clone()


@pytest.mark.gpu
@pytest.mark.parametrize("top_k", [2, 8])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_experts_with_and_without_gradients_compute_the_same_bits_on_cuda(fmt, top_k, monkeypatch):
    torch.manual_seed(0)
    plan = PrecisionPlan(num_layers=1, format=fmt, compute_dtype="bfloat16", bf16_last_fraction=0.0)
    experts = PlannedExperts(16, 64, 32, fmt=fmt, plan=plan).cuda()
    x = torch.randn(24, 64, device="cuda", dtype=torch.bfloat16)
    top_w, top_i = torch.randn(24, 16, device="cuda").softmax(-1).topk(top_k)
    with torch.no_grad():
        pi_old = experts(x, top_i, top_w)
        # a sampler decodes a few rows, the trainer scores many: each row's bits whatever the batch
        for rows in (1, 5):
            assert torch.equal(experts(x[:rows], top_i[:rows], top_w[:rows]), pi_old[:rows])
    sut = _grads(experts, x, top_i, top_w)
    assert experts.runs_grouped() and torch.equal(sut[0], pi_old)  # the first importance ratio is exactly 1
    if fmt == "nvfp4":  # the per-expert loop exists for quantised experts only
        monkeypatch.setattr(experts, "runs_grouped", lambda: False)
        ref = _grads(experts, x, top_i, top_w)
        for s, r in zip(sut[1:], ref[1:], strict=True):
            # torch._grouped_mm (float32 accumulation) against the loop's float64-accumulated products,
            # both rounded to bf16: about a bf16 ulp apart, as a relative norm
            assert ((s.float() - r.float()).norm() / r.float().norm()).item() < 1e-2
    assert all(torch.isfinite(g).all() for g in sut[1:])
