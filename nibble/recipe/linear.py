"""Quantised matmuls with the three backward modes of docs/design.md §3, as a ``torch.autograd.Function``.

Forward always runs on quantised operands, ``DQ(Q(x)) @ DQ(Q(W)).T``: on CUDA through the block-ordered NVFP4
GEMMs (:mod:`nibble.kernels.gemm`, weights decoded in registers), elsewhere decoded and multiplied in the
plan's compute dtype (on Blackwell the same codes feed FP4 tensor cores; the quantisation decisions are
the same everywhere). Backward:

- ``high_precision``: gradients of ``x @ W.T`` on the original operands;
- ``dequantized`` (the recipe): ``dgrad = dY @ DQ(Q(W))``, ``wgrad = dY.T @ DQ(Q(x))``, passed straight
  through to ``x`` and ``W``; only the codes and scales are saved from the forward;
- ``quantized``: the backward GEMMs also run on operands quantised along their contraction dimension
  (per row, zero-padded to the block), the pre-training-style baseline.
"""

from __future__ import annotations

import torch

from nibble.kernels import MXFP8Tensor, NVFP4Tensor, backend, gemm, nvfp4
from nibble.kernels.fragments import NVFP4Fragments
from nibble.recipe.compute import linear
from nibble.recipe.plan import PrecisionPlan
from nibble.recipe.quant import QuantizedWeight, fake_quantize, quantize_activation


def select(q: QuantizedWeight, index: int) -> QuantizedWeight:
    """Expert ``index`` of a quantised expert stack ``[E, N, K]``, as a ``[N, K]`` quantised weight (a
    sampler's fragment layout included, as a view: nothing is rebuilt per call)."""
    if isinstance(q, MXFP8Tensor):
        return MXFP8Tensor(q.elements[index], q.block_scales[index], q.scale_mode)
    fragments = q.fragments
    if fragments is not None:
        one = slice(index, index + 1)
        fragments = NVFP4Fragments(fragments.words[one], fragments.scales[one], fragments.n, fragments.k)
    return NVFP4Tensor(
        q.codes[index], q.block_scales[index], q.global_scale[index], q.four_over_six, q.shape[1:], fragments
    )


def uses_kernels(x: torch.Tensor, fmt: str) -> bool:
    """Whether NVFP4 products on ``x``'s device run the GPU GEMMs (:mod:`nibble.kernels.gpu.gemm`) rather than
    dequantise-and-multiply in the compute dtype (the CPU path, bit-exact across batch shapes)."""
    return fmt == "nvfp4" and backend.resolve(x.device, None) == "triton"


def dequantize(q: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """Decode a quantised operand on the default backend of its device."""
    return nvfp4.dequantize(q, dtype) if isinstance(q, NVFP4Tensor) else q.dequantize(dtype)


def forward_product(qx: QuantizedWeight, qweight: QuantizedWeight, fmt: str, plan: PrecisionPlan) -> torch.Tensor:
    """``DQ(qx) @ DQ(qweight).T`` in the plan's compute dtype: the packed GEMM where it runs, else decode
    both operands and multiply (:func:`nibble.recipe.compute.linear`)."""
    cd = plan.torch_compute_dtype
    if uses_kernels(qx.codes if isinstance(qx, NVFP4Tensor) else qx.elements, fmt):
        return gemm.matmul(qx, qweight, out_dtype=cd)
    return linear(dequantize(qx, cd), dequantize(qweight, cd))


def tensor_parts(q: QuantizedWeight) -> tuple[torch.Tensor, ...]:
    """The tensors of a quantised operand (codes or elements, scales), for ``ctx.save_for_backward``."""
    if isinstance(q, MXFP8Tensor):
        return (q.elements, q.block_scales)
    return (q.codes, q.block_scales, q.global_scale)


def rebuild_tensor(like: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> QuantizedWeight:
    """A quantised operand of ``like``'s kind and settings from :func:`tensor_parts`' tensors."""
    if isinstance(like, MXFP8Tensor):
        return MXFP8Tensor(*parts, like.scale_mode)
    return NVFP4Tensor(*parts, like.four_over_six, like.shape)


class QuantizedMatmul(torch.autograd.Function):
    """``y [N, out] = DQ(Q(x)) @ DQ(qweight).T`` with gradients to ``x [N, K]`` and ``weight [out, K]``.

    ``qweight`` must be the quantisation of ``weight``'s bf16 cast (see :func:`quantize_weight`); it
    is passed in so an expert stack is quantised once per forward, not once per expert.
    """

    @staticmethod
    def forward(ctx, x, weight, qweight, fmt: str, plan: PrecisionPlan):
        qx = quantize_activation(x, fmt, plan)
        y = forward_product(qx, qweight, fmt, plan)
        ctx.fmt, ctx.plan, ctx.x_dtype = fmt, plan, x.dtype
        if plan.backward == "dequantized":
            ctx.like = (qx, qweight)
            ctx.n_x = len(tensor_parts(qx))
            ctx.save_for_backward(*tensor_parts(qx), *tensor_parts(qweight))
        else:
            ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    def backward(ctx, dy):
        plan, cd = ctx.plan, ctx.plan.torch_compute_dtype
        dy = dy.to(cd)
        if plan.backward == "dequantized":
            saved = ctx.saved_tensors
            qx = rebuild_tensor(ctx.like[0], saved[: ctx.n_x])
            qw = rebuild_tensor(ctx.like[1], saved[ctx.n_x :])
            x_op, w_op, dy_dgrad, dy_wgrad = dequantize(qx, cd), dequantize(qw, cd), dy, dy
        else:
            x, weight = ctx.saved_tensors
            x_op, w_op, dy_dgrad, dy_wgrad = x.to(cd), weight.to(cd), dy, dy
            if plan.backward == "quantized":
                dy_dgrad = fake_quantize(dy, ctx.fmt, plan)
                # like every quantised weight, from its bf16 cast (docs/design.md section 3)
                w_op = fake_quantize(weight.to(torch.bfloat16).to(cd).T, ctx.fmt, plan).T
                dy_wgrad = fake_quantize(dy.T, ctx.fmt, plan).T
                x_op = fake_quantize(x_op.T, ctx.fmt, plan).T
        grad_x = linear(dy_dgrad, w_op.T).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        grad_w = linear(dy_wgrad.T, x_op.T).to(torch.float32) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None, None


def quantized_matmul(
    x: torch.Tensor, weight: torch.Tensor | None, qweight: QuantizedWeight, fmt: str, plan: PrecisionPlan
) -> torch.Tensor:
    """``x [N, K] -> [N, out]`` through quantised operands.

    With ``weight`` (the float32 master, trainer side) gradients flow per the plan's backward mode;
    with ``weight=None`` (packed weights, sampler side) it is a plain no-grad forward with the same bits.
    """
    if weight is None or not torch.is_grad_enabled():
        # no autograd context keeps qx, so the decoded operand lives only as long as the product
        qx = quantize_activation(x, fmt, plan, gemm_operand=uses_kernels(x, fmt))
        return forward_product(qx, qweight, fmt, plan)
    return QuantizedMatmul.apply(x, weight, qweight, fmt, plan)
