"""Expert products over rows sorted by expert, ``out[r] = a[rows[r]] @ W[experts[r]].T``, with gradients.

One function per product serves the sampler, ``π_old`` scoring and the trainer's ``π_θ``, so the three
compute the same bits (the first update's importance ratio is exactly 1):

- where grouped GEMMs run (CUDA, bf16 compute) a product is one launch for all experts: the packed NVFP4
  grouped GEMM (:func:`nibble.kernels.gemm.grouped_matmul`) or ``torch._grouped_mm`` for bf16 weights,
  and the recipe's dequantised backward is two more ``torch._grouped_mm`` launches;
- elsewhere (the CPU, MXFP8) each expert runs one float64-accumulated matmul over its rows
  (:func:`nibble.recipe.compute.linear`), the batch-shape-independent arithmetic of the CPU path.

Grouping quantises each token once for all its experts; that is the per-expert function only when a
token's codes do not depend on the other rows (per-token NVFP4 scales, MXFP8), which callers check.
"""

from __future__ import annotations

import torch

from nibble.kernels import gemm
from nibble.kernels.gpu import grouped
from nibble.recipe.compute import linear
from nibble.recipe.linear import dequantize, rebuild_tensor, select, tensor_parts, uses_kernels
from nibble.recipe.plan import PrecisionPlan
from nibble.recipe.quant import QuantizedWeight, quantize_activation


def _segments(experts: torch.Tensor, num_experts: int) -> list[tuple[int, int, int]]:
    """``(expert, start, stop)`` of each non-empty run of the sorted int64 ``experts [R]`` (host sync)."""
    counts = torch.bincount(experts, minlength=num_experts).tolist()
    spans, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            spans.append((expert, start, start + count))
            start += count
    return spans


def expert_linear(a: torch.Tensor, weight: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``out[r] = a[r] @ weight[experts[r]].T`` for unquantised weights; autograd differentiates it.

    Args:
        a: ``[R, K]`` in the compute dtype, rows sorted by expert.
        weight: ``[E, N, K]`` in the same dtype (the bf16 operand of the experts' masters).
        experts: int64 ``[R]``, sorted ascending.
    Returns:
        ``[R, N]`` in ``a``'s dtype: ``torch._grouped_mm`` (float32 accumulation, as the sampler has always
        run bf16 experts on GPUs) where it runs, else float64-accumulated matmuls per expert.
    """
    if grouped.available(a.device, a.dtype):
        return grouped.grouped_mm(a, weight, experts)
    outputs = [linear(a[start:stop], weight[e]) for e, start, stop in _segments(experts, weight.shape[0])]
    return torch.cat(outputs) if outputs else a.new_zeros(0, weight.shape[1])


def quantized_product(
    qa: QuantizedWeight,
    qweight: QuantizedWeight,
    experts: torch.Tensor,
    rows: torch.Tensor | None,
    fmt: str,
    plan: PrecisionPlan,
) -> torch.Tensor:
    """``out[r] = DQ(qa)[rows[r]] @ DQ(qweight[experts[r]]).T`` in the plan's compute dtype, no gradients.

    Args:
        qa: quantised activations ``[T, K]`` (each token once).
        qweight: quantised expert stack ``[E, N, K]``.
        experts: int64 ``[R]``, sorted ascending.
        rows: int64 ``[R]`` indices into ``qa``'s rows, or None for ``R == T`` rows in order.
    Returns:
        ``[R, N]``: the packed NVFP4 grouped GEMM on CUDA, else decode and multiply per expert exactly as
        :func:`nibble.recipe.linear.forward_product` does for one expert.
    """
    cd = plan.torch_compute_dtype
    if uses_kernels(qa.codes if fmt == "nvfp4" else qa.elements, fmt):
        return gemm.grouped_matmul(qa, qweight, experts, rows, out_dtype=cd, validate=False)
    x = dequantize(qa, cd)
    x = x if rows is None else x[rows]
    spans = _segments(experts, qweight.shape[0])
    outputs = [linear(x[start:stop], dequantize(select(qweight, e), cd)) for e, start, stop in spans]
    return torch.cat(outputs) if outputs else x.new_zeros(0, qweight.shape[1])


def _dgrad(dy: torch.Tensor, w_op: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``[R, K]``: ``dy[r] @ w_op[experts[r]]``."""
    if grouped.available(dy.device, dy.dtype):
        return grouped.grouped_mm_dgrad(dy, w_op, experts)
    outputs = [linear(dy[start:stop], w_op[e].T) for e, start, stop in _segments(experts, w_op.shape[0])]
    return torch.cat(outputs) if outputs else dy.new_zeros(0, w_op.shape[2])


def _wgrad(dy: torch.Tensor, x_op: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[E, N, K]``: per expert ``dy[its rows].T @ x_op[its rows]``, zeros for an expert without rows."""
    if grouped.available(dy.device, dy.dtype):
        return grouped.grouped_mm_wgrad(dy, x_op, experts, num_experts)
    out = dy.new_zeros(num_experts, dy.shape[1], x_op.shape[1])
    for e, start, stop in _segments(experts, num_experts):
        out[e] = linear(dy[start:stop].T, x_op[start:stop].T)
    return out


def sum_into_rows(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """``out[t] = Σ values[r] over rows[r] == t`` for ``values [R, H]``, int64 ``rows [R]`` in ``[0, count)``:
    ``[count, H]`` in ``values``' dtype, the same bits on every call and on every device.

    On the CPU that is ``index_add``: float32 accumulation for 16-bit dtypes from zero, rows in ascending
    order, one rounding. On CUDA ``index_add`` adds with atomics in whatever order its threads run (its
    bits vary from call to call, with a bf16 rounding at every add), so there ``index_put_`` with
    ``accumulate=True`` does it, which sorts the rows first and adds each target's in ascending order
    (deterministic: PyTorch's reproducibility notes list only its CPU form as nondeterministic) — into a
    float32 buffer, since it rounds to its destination's dtype at every add."""
    if not values.is_cuda:
        return values.new_zeros(count, values.shape[1]).index_add(0, rows, values)
    accumulate = torch.promote_types(values.dtype, torch.float32)
    out = torch.zeros((count, values.shape[1]), dtype=accumulate, device=values.device)
    return out.index_put_((rows,), values.to(accumulate), accumulate=True).to(values.dtype)


class GroupedQuantizedMatmul(torch.autograd.Function):
    """:func:`quantized_product` of ``a`` and an expert stack, with the recipe's dequantised backward.

    Per expert this is :class:`nibble.recipe.linear.QuantizedMatmul` in mode ``dequantized``:
    ``dgrad = dY @ DQ(Q(W))``, ``wgrad = dY.T @ DQ(Q(x))``, passed straight through to ``a`` and
    ``weight``; only codes and scales are saved from the forward.

    Inputs: ``a [T, K]`` in the compute dtype; ``weight [E, N, K]`` float32 masters and ``qweight`` their
    quantisation (:func:`nibble.recipe.quant.quantize_weight`, passed in so the stack is quantised once);
    ``experts`` int64 ``[R]`` sorted; ``rows`` int64 ``[R]`` into ``a`` or None (``R == T``). Output
    ``[R, N]`` in the compute dtype; gradients ``[T, K]`` in ``a``'s dtype and ``[E, N, K]`` float32.
    """

    @staticmethod
    def forward(ctx, a, weight, qweight, experts, rows, fmt: str, plan: PrecisionPlan):
        qa = quantize_activation(a, fmt, plan)
        y = quantized_product(qa, qweight, experts, rows, fmt, plan)
        ctx.plan, ctx.a_dtype, ctx.a_rows = plan, a.dtype, a.shape[0]
        ctx.like, ctx.n_a, ctx.has_rows = (qa, qweight), len(tensor_parts(qa)), rows is not None
        ctx.save_for_backward(experts, *(() if rows is None else (rows,)), *tensor_parts(qa), *tensor_parts(qweight))
        return y

    @staticmethod
    def backward(ctx, dy):
        cd = ctx.plan.torch_compute_dtype
        experts, *saved = ctx.saved_tensors
        rows = saved.pop(0) if ctx.has_rows else None
        qa = rebuild_tensor(ctx.like[0], tuple(saved[: ctx.n_a]))
        qweight = rebuild_tensor(ctx.like[1], tuple(saved[ctx.n_a :]))
        dy = dy.to(cd).contiguous()  # the grouped GEMM wants 16-byte-aligned strides, not an expanded gradient
        grad_a = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_a = _dgrad(dy, dequantize(qweight, cd), experts)
            if rows is not None:  # a token's rows (one per chosen expert) sum into its gradient
                grad_a = sum_into_rows(grad_a, rows, ctx.a_rows)
            grad_a = grad_a.to(ctx.a_dtype)
        if ctx.needs_input_grad[1]:
            x_op = dequantize(qa, cd)
            x_op = x_op if rows is None else x_op[rows]
            grad_w = _wgrad(dy, x_op, experts, qweight.shape[0]).to(torch.float32)
        return grad_a, grad_w, None, None, None, None, None


def grouped_quantized_matmul(
    a: torch.Tensor,
    weight: torch.Tensor | None,
    qweight: QuantizedWeight,
    experts: torch.Tensor,
    rows: torch.Tensor | None,
    fmt: str,
    plan: PrecisionPlan,
) -> torch.Tensor:
    """``a [T, K] -> [R, N]`` through a quantised expert stack, rows sorted by expert.

    With ``weight`` (the float32 masters ``[E, N, K]``, trainer side) and autograd on, gradients flow per
    the dequantised backward; otherwise (``weight=None``: packed weights, sampler side) a no-grad forward.
    Both run the same forward, so ``π_θ`` and ``π_old`` get the same bits.
    """
    if weight is None or not torch.is_grad_enabled():
        qa = quantize_activation(a, fmt, plan, gemm_operand=uses_kernels(a, fmt))
        return quantized_product(qa, qweight, experts, rows, fmt, plan)
    return GroupedQuantizedMatmul.apply(a, weight, qweight, experts, rows, fmt, plan)
