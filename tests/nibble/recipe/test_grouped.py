"""Grouped expert products: π_θ (autograd on) computes π_old's bits, and the grouped dequantised backward
gives the per-expert loop's gradients."""

import copy

import pytest
import torch

from nibble.kernels.gpu import grouped as grouped_kernels
from nibble.recipe import PlannedExperts, PrecisionPlan
from nibble.recipe.grouped import sum_into_rows
from tests.helpers import expert_routing

TOKENS, HIDDEN, INTER, EXPERTS = 24, 64, 32, 8


def experts_and_inputs(fmt: str, compute_dtype: str = "float32", **plan_options):
    torch.manual_seed(0)
    plan = PrecisionPlan(num_layers=1, format=fmt, compute_dtype=compute_dtype, **plan_options)
    experts = PlannedExperts(EXPERTS, HIDDEN, INTER, fmt=fmt, plan=plan)
    x = torch.randn(TOKENS, HIDDEN).to(plan.torch_compute_dtype)
    scores = torch.randn(TOKENS, EXPERTS)
    scores[:, 5] = -torch.inf  # expert 5 gets no rows
    top_w, top_i = scores.softmax(-1).topk(2)
    return experts, x, top_i, top_w


def grads(experts, x, top_i, top_w, dy):
    x = x.clone().requires_grad_()
    experts.zero_grad()
    y = experts(x, top_i, top_w)
    y.backward(dy)
    return y.detach(), x.grad, experts.gate_up_proj.grad.clone(), experts.down_proj.grad.clone()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "bf16"])
def test_the_trainer_forward_computes_the_sampler_and_pi_old_bits(fmt):
    experts, x, top_i, top_w = experts_and_inputs(fmt, bf16_last_fraction=0.0)
    sampler = copy.deepcopy(experts)
    sampler.pack()
    with torch.no_grad():
        pi_old = experts(x, top_i, top_w)
        sampled = sampler(x, top_i, top_w)
    pi_theta = experts(x, top_i, top_w)
    assert experts.runs_grouped() and pi_theta.requires_grad
    # the first update's importance ratio is exactly 1: the same bits, not merely close
    assert torch.equal(pi_theta.detach(), pi_old) and torch.equal(sampled, pi_old)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_grouped_gradients_equal_the_per_expert_loop(fmt, monkeypatch):
    experts, x, top_i, top_w = experts_and_inputs(fmt, backward="dequantized", bf16_last_fraction=0.0)
    dy = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    sut = grads(experts, x, top_i, top_w, dy)
    monkeypatch.setattr(experts, "runs_grouped", lambda: False)
    ref = grads(experts, x, top_i, top_w, dy)
    assert not sut[2][5].any() and not sut[3][5].any()  # an expert without rows gets no gradient
    for s, r in zip(sut, ref, strict=True):
        # float64-accumulated products on both sides; only the order in which a token's k expert
        # gradients are summed (index_add vs autograd's gather backward) may differ: float32 roundings
        torch.testing.assert_close(s, r, rtol=1e-6, atol=1e-7)


def test_bf16_grouped_gradients_equal_a_per_token_reference():
    experts, x, top_i, top_w = experts_and_inputs("bf16")
    dy = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    sut = grads(experts, x, top_i, top_w, dy)
    x_ref = x.clone().requires_grad_()
    gate_up, down = (w.detach().clone().requires_grad_() for w in (experts.gate_up_proj, experts.down_proj))
    # the bf16 cast straight through, as the experts have it: a bf16 value, an unrounded gradient
    gate_up_st, down_st = (w + (w.to(torch.bfloat16).float() - w).detach() for w in (gate_up, down))
    wide = [t.to(torch.float64) for t in (x_ref, gate_up_st, down_st)]
    y_ref = torch.zeros(TOKENS, HIDDEN, dtype=torch.float64)
    for t in range(TOKENS):
        for j in range(2):
            e = int(top_i[t, j])
            gate, up = (wide[1][e] @ wide[0][t]).chunk(2)
            y_ref[t] += float(top_w[t, j]) * (wide[2][e] @ (torch.nn.functional.silu(gate) * up))
    y_ref.backward(dy.to(torch.float64))
    # float64 per-token reference vs float32 results (rounded after each product): float32 roundings
    torch.testing.assert_close(sut[0], y_ref.float(), rtol=1e-5, atol=1e-6)
    for s, r in zip(sut[1:], (x_ref.grad, gate_up.grad, down.grad), strict=True):
        torch.testing.assert_close(s, r.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backward", ["high_precision", "quantized"])
def test_other_backward_modes_and_per_tensor_scales_keep_the_loop(backward):
    experts, *_ = experts_and_inputs("nvfp4", backward=backward)
    assert not experts.runs_grouped()
    with torch.no_grad():
        assert experts.runs_grouped()  # π_old and the sampler: no backward to honour
    per_tensor, *_ = experts_and_inputs("nvfp4", activation_scale="per_tensor")
    with torch.no_grad():
        assert not per_tensor.runs_grouped()


def test_the_grouped_gemm_backward_in_bf16_matches_the_loop(monkeypatch):
    # The CUDA branch (torch._grouped_mm for dgrad and wgrad), run here by PyTorch's CPU reference kernel:
    # checks layouts, offsets and the scatter of a token's k rows; bf16 compute on both sides.
    experts, x, top_i, top_w = experts_and_inputs("nvfp4", "bfloat16", backward="dequantized", bf16_last_fraction=0.0)
    dy = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = grads(experts, x, top_i, top_w, dy)
    monkeypatch.setattr(grouped_kernels, "available", lambda device, dtype: dtype == torch.bfloat16)
    sut = grads(experts, x, top_i, top_w, dy)
    assert torch.equal(sut[0], ref[0])  # forward: the same per-expert decode-and-multiply on the CPU
    for s, r in zip(sut[1:], ref[1:], strict=True):
        # float32 accumulation (grouped) vs float64 (loop), each rounded once to bf16: about one bf16
        # ulp apart, as a relative norm over the whole gradient
        assert ((s.float() - r.float()).norm() / r.float().norm()).item() < 1e-2


def test_sum_into_rows_is_index_add_on_the_cpu():
    values, _, order = expert_routing(37, 8, 16, 24, torch.bfloat16, 1)
    rows = order // 8
    want = torch.zeros(37, 24, dtype=torch.bfloat16).index_add(0, rows, values)
    assert torch.equal(sum_into_rows(values, rows, 37).view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [64, 4096])
def test_sum_into_rows_on_cuda_gives_the_same_bits_every_call(tokens):
    values, _, order = expert_routing(tokens, 8, 128, 2048, torch.bfloat16, tokens)
    rows = order // 8
    on_cuda = (values.cuda(), rows.cuda())
    first = sum_into_rows(*on_cuda, tokens).cpu().view(torch.int16)
    for _ in range(10):
        again = sum_into_rows(*on_cuda, tokens).cpu().view(torch.int16)
        assert torch.equal(again, first), f"{int((again != first).sum())} elements differ between two calls"
    # and the CPU's bits: float32 accumulation in ascending row order, as the CPU's index_add
    cpu = sum_into_rows(values, rows, tokens).view(torch.int16)
    assert torch.equal(first, cpu), f"{int((first != cpu).sum())} elements differ from the CPU's"
