"""Rotary position embedding (RoPE) tables: the default frequencies and YaRN's context extension.

YaRN (Peng et al., 2023, "YaRN: Efficient Context Window Extension of Large Language Models",
arXiv:2309.00071 §3) blends, per frequency, the original ("extrapolated") frequency and the one divided by
``factor`` ("interpolated") with a linear ramp between the dimensions that complete ``beta_fast`` and
``beta_slow`` rotations over the original context, and scales cos/sin by an attention factor
(``0.1 ln(factor) + 1`` by default). Hugging Face's Qwen configs spell it
``rope_parameters = {rope_type: yarn, factor, original_max_position_embeddings, ...}``; the parameters
below keep those names and transformers' defaults, so logits match its implementation.
"""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, ConfigDict, Field


class YarnScaling(BaseModel):
    """``rope_parameters`` of ``rope_type: yarn`` (every key named as in Hugging Face's configs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    factor: float | None = Field(
        None, gt=0, description="context extension factor; absent: max_position_embeddings / the original"
    )
    original_max_position_embeddings: int | None = Field(
        None, ge=1, description="the pre-trained context; absent: max_position_embeddings"
    )
    beta_fast: float = Field(32.0, gt=0)
    beta_slow: float = Field(1.0, gt=0)
    attention_factor: float | None = Field(None, gt=0, description="cos/sin scale; absent: from factor and mscale")
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def to_hf(self) -> dict:
        return {"rope_type": "yarn", **self.model_dump(exclude_none=True)}


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(rotations: float, dim: int, base: float, context: int) -> float:
    """The dimension whose frequency completes ``rotations`` turns over ``context`` positions."""
    return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))


def frequencies(
    head_dim: int,
    theta: float,
    max_position_embeddings: int,
    yarn: YarnScaling | None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """``inv_freq`` (float32 ``[head_dim / 2]`` on ``device``, radians per position) and the cos/sin scale.

    Built on ``device`` directly (no host-to-device copy, so a CUDA graph can capture the forward)."""
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    if yarn is None:
        return 1.0 / pos_freqs, 1.0
    original = yarn.original_max_position_embeddings or max_position_embeddings
    factor = yarn.factor if yarn.factor is not None else max_position_embeddings / original
    if yarn.attention_factor is not None:
        scale = yarn.attention_factor
    elif yarn.mscale and yarn.mscale_all_dim:
        scale = _mscale(factor, yarn.mscale) / _mscale(factor, yarn.mscale_all_dim)
    else:
        scale = _mscale(factor)
    low = _correction_dim(yarn.beta_fast, head_dim, theta, original)
    high = _correction_dim(yarn.beta_slow, head_dim, theta, original)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp  # 1: keep the original frequency (fast dimensions), 0: interpolate
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated
    return inv_freq, float(scale)


def rotary(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables ``cos, sin [B, T, head_dim]`` (float32) for integer ``positions [B, T]``."""
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scale, emb.sin() * scale
