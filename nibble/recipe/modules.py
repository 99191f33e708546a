"""Linear layers and expert stacks that compute in whatever format the precision plan gives them.

Each module holds a float32 master weight (trainer side) until :meth:`pack` replaces it with what a
sampler keeps: packed NVFP4/MXFP8 codes for quantised weights, bf16 for the rest. Both sides run the
same arithmetic on the same bytes: every weight enters the forward through its bf16 cast.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from nibble.kernels import backend
from nibble.kernels.validation import FLOAT_DTYPES
from nibble.recipe.compute import linear
from nibble.recipe.grouped import expert_linear, grouped_quantized_matmul
from nibble.recipe.linear import quantized_matmul, select
from nibble.recipe.plan import PrecisionPlan
from nibble.recipe.quant import QuantizedWeight, quantize_weight, sampler_form


def bf16_operand(weight: torch.Tensor, plan: PrecisionPlan) -> torch.Tensor:
    """A high-precision weight as both sides see it: its bf16 cast, in the plan's compute dtype.

    In float32 compute the cast is straight-through for autograd: the forward value is exactly the bf16
    cast (``w + (bf16(w) - w)`` is exact: the difference of two floats within a factor 2 of each other is
    representable), while the gradient reaches the float32 master unrounded — a gradient rounded to bf16
    would lose the precision the float32 master exists for, and would make sums of gradient shards
    (data-parallel ranks) differ from the whole.
    """
    cast = weight.to(torch.bfloat16).to(plan.torch_compute_dtype)
    if cast.dtype != weight.dtype or not weight.requires_grad:
        return cast
    return weight + (cast - weight).detach()


class PlannedLinear(nn.Module):
    """``y = x @ W.T (+ b)`` with ``W [out, in]`` in the format ``fmt`` (``bf16`` | ``mxfp8`` | ``nvfp4``).

    Input ``[..., in]`` in any float dtype, output ``[..., out]`` in the plan's compute dtype.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool, fmt: str, plan: PrecisionPlan):
        super().__init__()
        self.fmt, self.plan = fmt, plan
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.packed: QuantizedWeight | None = None
        nn.init.normal_(self.weight, std=1 / math.sqrt(in_features))

    def forward(self, x: torch.Tensor, qweight: QuantizedWeight | None = None) -> torch.Tensor:
        """``x [..., in]`` -> ``[..., out]``. ``qweight``: this weight's quantisation made by the caller
        (a group sharing one global scale, :func:`~nibble.recipe.quant.quantize_weights_together`);
        by default the module quantises its own weight."""
        cd = self.plan.torch_compute_dtype
        bias = None if self.bias is None else bf16_operand(self.bias, self.plan)
        if self.fmt == "bf16":
            return linear(x.to(cd), bf16_operand(self.weight, self.plan), bias)
        weight = None if self.packed is not None else self.weight
        if self.packed is not None:
            qweight = self.packed
        elif qweight is None:
            qweight = quantize_weight(self.weight, self.fmt, self.plan)
        y = quantized_matmul(x.reshape(-1, x.shape[-1]).to(cd), weight, qweight, self.fmt, self.plan)
        y = y.reshape(*x.shape[:-1], -1)
        return y if bias is None else y + bias

    @torch.no_grad()
    def pack(self, qweight: QuantizedWeight | None = None) -> None:
        """Sampler form: quantised weights kept packed, high-precision ones as bf16; no gradients.
        ``qweight`` as in :meth:`forward`."""
        if self.fmt == "bf16":
            self.weight = nn.Parameter(self.weight.to(torch.bfloat16), requires_grad=False)
        else:
            q = qweight if qweight is not None else quantize_weight(self.weight, self.fmt, self.plan)
            self.packed = sampler_form(q)
            del self.weight
            self.register_parameter("weight", None)
        if self.bias is not None:
            self.bias = nn.Parameter(self.bias.to(torch.bfloat16), requires_grad=False)


def combine_in_expert_order(weighted: torch.Tensor, top_k_index: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Each token's sum of its ``top_k`` weighted expert outputs, accumulated in float32 (float64 stays
    float64) from zero in ascending expert order and rounded once to ``weighted``'s dtype.

    That is what ``torch.index_add`` does on the CPU (bf16 included: it accumulates in float32); on CUDA
    ``index_add`` adds with atomics in whatever order its threads run, rounding bf16 at every add, so with
    more than two experts per token a sum's bits could change from run to run, and the sampler's from the
    trainer's. Here the order and the roundings are fixed, and the same on every device (which NaN comes
    out of NaN inputs aside): on CUDA in one Triton launch (:mod:`nibble.kernels.gpu.expert_combine`, the
    same bits, checked by its GPU test), elsewhere with PyTorch operators (:func:`combine_composed`). The
    gradient is ``index_add``'s: each row gets its token's output gradient.

    Args:
        weighted: ``[N * top_k, H]``, rows sorted by expert (row ``r`` holds flat routing slot ``order[r]``).
        top_k_index: int64 ``[N, top_k]``, each token's experts, ``top_k`` ≥ 1.
        order: int64 ``[N * top_k]``, the stable argsort of ``top_k_index.reshape(-1)``.
    Returns:
        ``[N, H]`` in ``weighted``'s dtype.
    """
    return _CombineInExpertOrder.apply(weighted, top_k_index, order)


def combine_composed(weighted: torch.Tensor, top_k_index: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """:func:`combine_in_expert_order`'s forward written with PyTorch operators (no autograd Function): what
    runs off CUDA, and the reference the one-launch kernel is measured against
    (``benchmarks/expert_combine_gpu.py``). Same arguments and result."""
    tokens, top_k = top_k_index.shape
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    # a token's rows of ``weighted`` in ascending row order are its experts in ascending order
    contributions = weighted[position.view(tokens, top_k).sort(dim=1).values]
    accumulate = torch.promote_types(weighted.dtype, torch.float32)
    out = torch.zeros((tokens, weighted.shape[1]), dtype=accumulate, device=weighted.device)
    for slot in range(top_k):
        out = out + contributions[:, slot]  # promoted to the accumulator's dtype exactly, then added
    return out.to(weighted.dtype)


def expert_order(top_k_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routing slots sorted by expert, stably: ``order = argsort(top_k_index.reshape(-1), stable=True)``, the
    sorted rows' experts and their tokens ``order // k`` (int64 ``[N * k]`` each, from int64 ``[N, k]``). On
    CUDA up to the kernel's measured crossover in one Triton launch (:mod:`nibble.kernels.gpu.expert_order`,
    the same integers), else ``torch.argsort``."""
    if top_k_index.is_cuda and top_k_index.dtype == torch.int64 and backend.triton_available():
        from nibble.kernels.gpu import expert_order as kernel  # imports triton: only where the kernel runs

        if top_k_index.numel() <= kernel.MAX_SLOTS:
            return kernel.expert_order(top_k_index)
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return order, flat[order], order // top_k_index.shape[1]


def _runs_combine_kernel(weighted: torch.Tensor, top_k_index: torch.Tensor, order: torch.Tensor) -> bool:
    """Whether the one-launch kernel takes these operands (what it accepts; the rest stays composed)."""
    return (
        weighted.is_cuda
        and weighted.dtype in FLOAT_DTYPES
        and top_k_index.dtype == order.dtype == torch.int64
        and top_k_index.device == order.device == weighted.device
        and top_k_index.shape[1] >= 1
        and order.numel() < 2**30
        and backend.triton_available()
    )


class _CombineInExpertOrder(torch.autograd.Function):
    """:func:`combine_in_expert_order` with ``index_add``'s backward (``grad.index_select`` of each row's
    token): autograd through the forward's gathers and adds would build a ``[N, top_k, H]`` float32 buffer
    per slot."""

    @staticmethod
    def forward(ctx, weighted: torch.Tensor, top_k_index: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(order)
        ctx.top_k = top_k_index.shape[1]
        if _runs_combine_kernel(weighted, top_k_index, order):
            from nibble.kernels.gpu import expert_combine  # imports triton: only where the kernel runs

            return expert_combine.expert_combine(weighted, top_k_index, order)
        return combine_composed(weighted, top_k_index, order)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (order,) = ctx.saved_tensors
        return grad.index_select(0, order // ctx.top_k), None, None


class PlannedExperts(nn.Module):
    """Routed SwiGLU experts as stacks: ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``.

    Quantised per expert projection with gate and up sharing one outer scale (they are one tensor).
    Tokens are sorted by expert and each projection is one grouped product (:mod:`nibble.recipe.grouped`)
    for the sampler, ``π_old`` scoring and ``π_θ`` alike: on CUDA in bf16 compute one launch for all
    experts, forward and backward, with no host synchronisation in the forward. Only the ``quantized``
    and ``high_precision`` backward modes with gradients, and per-tensor NVFP4 activation scales (a
    token's codes then depend on its expert's other tokens), keep one matmul per expert.
    """

    def __init__(self, num_experts: int, hidden: int, inter: int, *, fmt: str, plan: PrecisionPlan):
        super().__init__()
        self.fmt, self.plan, self.num_experts = fmt, plan, num_experts
        self.gate_up_proj = nn.Parameter(torch.randn(num_experts, 2 * inter, hidden) / math.sqrt(hidden))
        self.down_proj = nn.Parameter(torch.randn(num_experts, hidden, inter) / math.sqrt(inter))
        self.packed: tuple[QuantizedWeight, QuantizedWeight] | None = None

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """``x [N, H]``, ``top_k_index`` int64 ``[N, k]``, ``top_k_weights [N, k]`` -> ``[N, H]`` in the
        plan's compute dtype."""
        cd = self.plan.torch_compute_dtype
        order, experts, token = expert_order(top_k_index)
        if self.runs_grouped():
            gate_up, down = self._grouped_operands()
            gate, up = self._grouped_product(x.to(cd), gate_up, experts, token).chunk(2, dim=-1)
            routed = self._grouped_product(F.silu(gate) * up, down, experts, None)
        else:
            routed = self._looped(x.to(cd)[token], experts)
        weighted = routed * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(cd)
        return combine_in_expert_order(weighted, top_k_index, order)

    def runs_grouped(self) -> bool:
        """Whether this forward runs the grouped products (else one matmul per expert)."""
        if self.fmt == "bf16":
            return True  # autograd differentiates the grouped product itself, whatever the backward mode
        # Quantising each token once for all its experts is the per-expert function only when a token's
        # codes do not depend on the other rows; MXFP8 scales are per 32-element block of one row.
        row_independent = self.fmt == "mxfp8" or self.plan.activation_scale == "per_token"
        needs_grad = self.packed is None and torch.is_grad_enabled()
        return row_independent and (not needs_grad or self.plan.backward == "dequantized")

    def _grouped_operands(self):
        if self.fmt == "bf16":
            return [bf16_operand(w, self.plan) for w in (self.gate_up_proj, self.down_proj)]
        if self.packed is not None:
            return [(None, q) for q in self.packed]
        return [(w, quantize_weight(w, self.fmt, self.plan)) for w in (self.gate_up_proj, self.down_proj)]

    def _grouped_product(self, a: torch.Tensor, operand, experts: torch.Tensor, rows: torch.Tensor | None):
        """``out[r] = a[rows[r]] @ W[experts[r]].T`` (``rows=None``: row ``r``) for all experts at once."""
        if self.fmt == "bf16":
            return expert_linear(a if rows is None else a[rows], operand, experts)
        weight, qweight = operand
        return grouped_quantized_matmul(a, weight, qweight, experts, rows, self.fmt, self.plan)

    def _looped(self, xs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """The per-expert path: ``xs [R, H]`` sorted by ``experts [R]`` -> ``[R, H]``, one matmul each."""
        gate_up, down = self._operands()
        counts = torch.bincount(experts, minlength=self.num_experts).tolist()
        outputs, start = [], 0
        for expert, count in enumerate(counts):
            if count:
                segment = xs[start : start + count]
                gate, up = self._matmul(segment, gate_up, expert).chunk(2, dim=-1)
                outputs.append(self._matmul(F.silu(gate) * up, down, expert))
                start += count
        return torch.cat(outputs) if outputs else xs.new_zeros(0, xs.shape[-1])

    def _operands(self):
        if self.packed is not None:
            return [(None, q) for q in self.packed]
        return [(w, quantize_weight(w, self.fmt, self.plan)) for w in (self.gate_up_proj, self.down_proj)]

    def _matmul(self, x: torch.Tensor, operand, expert: int) -> torch.Tensor:
        weight, qweight = operand
        w = None if weight is None else weight[expert]
        return quantized_matmul(x, w, select(qweight, expert), self.fmt, self.plan)

    @torch.no_grad()
    def pack(self) -> None:
        """Sampler form (see :meth:`PlannedLinear.pack`)."""
        if self.fmt == "bf16":
            self.gate_up_proj = nn.Parameter(self.gate_up_proj.to(torch.bfloat16), requires_grad=False)
            self.down_proj = nn.Parameter(self.down_proj.to(torch.bfloat16), requires_grad=False)
            return
        self.packed = tuple(
            sampler_form(quantize_weight(w, self.fmt, self.plan)) for w in (self.gate_up_proj, self.down_proj)
        )
        del self.gate_up_proj, self.down_proj
        self.register_parameter("gate_up_proj", None)
        self.register_parameter("down_proj", None)
