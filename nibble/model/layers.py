"""Transformer blocks with Hugging Face Qwen3-MoE / Qwen2-MoE / Llama / Qwen2 / Qwen3 math and parameter names."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nibble.kernels.validation import FLOAT_DTYPES
from nibble.model.config import ModelConfig
from nibble.model.kv_cache import KVCache
from nibble.recipe.compute import (
    AttentionMask,
    attention,
    linear,
    rms_normalize,
    runs_rms_norm_kernel,
    softmax,
)
from nibble.recipe.modules import PlannedExperts, PlannedLinear, bf16_operand
from nibble.recipe.plan import PrecisionPlan
from nibble.recipe.quant import quantize_weights_together


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x²) + eps)`` (HF's Qwen RMSNorm; the statistic reduced in float64, see
    :mod:`nibble.recipe.compute`)."""

    def __init__(self, size: int, eps: float, plan: PrecisionPlan):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.plan = eps, plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., size]`` -> ``[..., size]`` in the plan's compute dtype."""
        dtype = self.plan.torch_compute_dtype
        if runs_rms_norm_kernel(x, self.weight, dtype):
            from nibble.kernels.gpu import rms_norm  # imports triton: only where the kernel runs

            return rms_norm.rms_norm(x, self.weight, self.eps)
        return bf16_operand(self.weight, self.plan) * rms_normalize(x, self.eps).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query attention with RoPE, per-head q/k RMSNorm (qwen3*) or q/k/v bias (qwen2*), optional
    q/k/v/o bias (``attention_bias``: llama, qwen3*)."""

    def __init__(self, config: ModelConfig, plan: PrecisionPlan, prefix: str):
        super().__init__()
        self.config, self.plan = config, plan
        h, nh, kvh, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim

        def linear(name: str, fan_in: int, fan_out: int, bias: bool) -> PlannedLinear:
            fmt = plan.format_of(f"{prefix}.{name}.weight")
            return PlannedLinear(fan_in, fan_out, bias=bias, fmt=fmt, plan=plan)

        self.q_proj = linear("q_proj", h, nh * hd, config.qkv_bias)
        self.k_proj = linear("k_proj", h, kvh * hd, config.qkv_bias)
        self.v_proj = linear("v_proj", h, kvh * hd, config.qkv_bias)
        self.o_proj = linear("o_proj", nh * hd, h, config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps, plan)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps, plan)

    def forward(self, x, cos, sin, mask: AttentionMask, cache: KVCache | None, layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.config.head_dim
        q = self.q_proj(x).view(b, t, -1, hd)
        k = self.k_proj(x).view(b, t, -1, hd)
        v = self.v_proj(x).view(b, t, -1, hd)
        if self._fuses_norm_and_rope(q, k, cos, sin):
            from nibble.kernels.gpu import rms_norm  # imports triton: only where the kernel runs

            # one launch for each head's norm and rotation, the same bits as the composition below
            q, k = (
                rms_norm.rms_norm(heads, norm.weight, norm.eps, rope=(cos, sin))
                for heads, norm in ((q, self.q_norm), (k, self.k_norm))
            )
        else:
            if self.config.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            cos, sin = cos.unsqueeze(2).to(q.dtype), sin.unsqueeze(2).to(q.dtype)  # over the heads
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        out = attention(q, k, v, mask)  # grouped-query: k, v keep their kv heads
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def _fuses_norm_and_rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """Whether the q/k norms and RoPE run as the fused kernel: q/k norms whose kernel runs here
        (:func:`runs_rms_norm_kernel`), and cos/sin ``[B, T, head_dim]`` for every sequence (the composition
        also broadcasts ``[1, T, head_dim]``) in a dtype the kernel loads."""
        dtype = self.plan.torch_compute_dtype
        tables_fit = all(
            tuple(table.shape) == (*q.shape[:2], q.shape[-1]) and table.dtype in FLOAT_DTYPES for table in (cos, sin)
        )
        return (
            self.config.qk_norm
            and tables_fit
            and all(runs_rms_norm_kernel(h, norm.weight, dtype) for h, norm in ((q, self.q_norm), (k, self.k_norm)))
        )


class MLP(nn.Module):
    """SwiGLU MLP ``down(silu(gate(x)) * up(x))``: dense layers and the shared expert.

    Under the plan's ``gate_up_global_scale='shared'`` NVFP4 gate and up weights are quantised together
    with one global scale (:meth:`PrecisionPlan.scale_group`), on the trainer and in the sampler form alike.
    """

    def __init__(self, hidden: int, inter: int, plan: PrecisionPlan, prefix: str):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            PlannedLinear(fan_in, fan_out, bias=False, fmt=plan.format_of(f"{prefix}.{name}.weight"), plan=plan)
            for name, fan_in, fan_out in (
                ("gate_proj", hidden, inter),
                ("up_proj", hidden, inter),
                ("down_proj", inter, hidden),
            )
        )
        self.shared_gate_up_scale = plan.scale_group(f"{prefix}.gate_proj.weight") is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q_gate = q_up = None
        if self.shared_gate_up_scale and self.gate_proj.packed is None:
            q_gate, q_up = quantize_weights_together((self.gate_proj.weight, self.up_proj.weight), self.gate_proj.plan)
        return self.down_proj(F.silu(self.gate_proj(x, q_gate)) * self.up_proj(x, q_up))

    @torch.no_grad()
    def pack(self) -> None:
        """Sampler form of the three projections (:meth:`PlannedLinear.pack`), gate and up quantised
        together when they share a global scale."""
        q_gate = q_up = None
        if self.shared_gate_up_scale:
            q_gate, q_up = quantize_weights_together((self.gate_proj.weight, self.up_proj.weight), self.gate_proj.plan)
        self.gate_proj.pack(q_gate)
        self.up_proj.pack(q_up)
        self.down_proj.pack()


class Router(nn.Module):
    """Top-k softmax router (``mlp.gate.weight [E, H]``), probabilities in float32."""

    def __init__(self, config: ModelConfig, plan: PrecisionPlan):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(config.num_experts, config.hidden_size) * 0.02)
        self.top_k, self.norm_topk_prob, self.plan = config.num_experts_per_tok, config.norm_topk_prob, plan

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = linear(x, bf16_operand(self.weight, self.plan))
        probs = softmax(logits)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return top_i, top_w.to(logits.dtype)


class SparseMoE(nn.Module):
    """Routed experts plus an optional sigmoid-gated shared expert (Qwen2-MoE's)."""

    def __init__(self, config: ModelConfig, plan: PrecisionPlan, prefix: str):
        super().__init__()
        self.gate = Router(config, plan)
        fmt = plan.format_of(f"{prefix}.experts.gate_up_proj")
        self.experts = PlannedExperts(
            config.num_experts, config.hidden_size, config.moe_intermediate_size, fmt=fmt, plan=plan
        )
        self.shared_expert = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = MLP(
                config.hidden_size, config.shared_expert_intermediate_size, plan, f"{prefix}.shared_expert"
            )
            self.shared_expert_gate = PlannedLinear(config.hidden_size, 1, bias=False, fmt="bf16", plan=plan)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        flat = x.reshape(-1, h)
        top_i, top_w = self.gate(flat)
        out = self.experts(flat, top_i, top_w)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(b, t, h)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; the MLP is routed experts in MoE
    layers and a dense SwiGLU MLP elsewhere (every layer of a dense architecture)."""

    def __init__(self, config: ModelConfig, plan: PrecisionPlan, index: int):
        super().__init__()
        prefix = f"model.layers.{index}"
        self.index = index
        self.self_attn = Attention(config, plan, f"{prefix}.self_attn")
        if config.is_moe_layer(index):
            self.mlp = SparseMoE(config, plan, f"{prefix}.mlp")
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, plan, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, plan)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, plan)

    def forward(self, x, cos, sin, mask: AttentionMask, cache: KVCache | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, self.index)
        return x + self.mlp(self.post_attention_layernorm(x))
