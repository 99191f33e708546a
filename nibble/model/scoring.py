"""Teacher-forced scoring: the trainer's logprobs and entropies of given response tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from nibble.model.transformer import MoETransformer
from nibble.recipe.compute import log_softmax

# Logits per chunk of token_logprobs: 2^25 float64 values are 256 MiB.
CHUNK_ELEMENTS = 1 << 25


@dataclass
class Scores:
    """Per-token results, right-padded to the longest response: all ``[B, R]``.

    ``logprobs`` float32 (``log_softmax(logits / T)`` of each response token, differentiable),
    ``entropy`` float32 (of that distribution, detached), ``mask`` bool (True on real tokens).
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor
    mask: torch.Tensor


def score(
    model: MoETransformer,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    pad_id: int = 0,
) -> Scores:
    """Score ``responses[i]`` after ``prompts[i]`` in one forward pass (prompts left-padded as in generation).

    Raises:
        ValueError: mismatched list lengths, an empty prompt, a ``temperature`` that is not a finite
            number > 0, or a sequence longer than the model's context.
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    _check_temperature(temperature)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    p_width = max(len(p) for p in prompts)
    r_width = max(max(len(r) for r in responses), 1)
    batch = len(prompts)
    ids = torch.full((batch, p_width + r_width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros(batch, p_width + r_width, dtype=torch.bool, device=device)
    mask = torch.zeros(batch, r_width, dtype=torch.bool, device=device)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        ids[row, p_width - len(prompt) : p_width] = torch.as_tensor(list(prompt))
        ids[row, p_width : p_width + len(response)] = torch.as_tensor(list(response), dtype=torch.long)
        valid[row, p_width - len(prompt) : p_width + len(response)] = True
        mask[row, : len(response)] = True
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, positions=positions, attention_mask=valid, logits_from=p_width - 1)[:, :r_width]
    logprobs, entropy = token_logprobs(logits, ids[:, p_width:], temperature)
    return Scores(logprobs=logprobs, entropy=entropy, mask=mask)


def _chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    logp_all = log_softmax(logits / temperature)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits / T)`` at ``targets`` (differentiable) and the distribution's entropy (detached).

    Args:
        logits: float32 ``[B, R, V]``. targets: int64 ``[B, R]``. temperature: ``T`` > 0.
    Returns:
        float32 ``[B, R]`` each.

    The full-vocabulary ``log_softmax`` is float64 (:func:`~nibble.recipe.compute.log_softmax`) and its
    backward would keep it: ``[B, R, V]`` float64, 7.5 GB for 64 responses of 300 tokens over SmolLM2's
    49 152 tokens, more than the model. So it runs :data:`CHUNK_ELEMENTS` logits at a time and, when a
    gradient is wanted, is recomputed in the backward (``torch.utils.checkpoint``): the same per-row
    operations, so the same bits as one pass, holding one chunk's float64 at a time.

    Raises:
        ValueError: naming the argument: ``temperature`` not a finite number > 0; ``logits`` not a 3-D
            floating-point tensor or with an empty vocabulary (``V == 0``); ``targets`` not an integer
            tensor of shape ``[B, R]`` or holding an id outside ``[0, V)``.
    """
    _check_inputs(logits, targets, temperature)
    b, r, v = logits.shape
    rows = max(1, CHUNK_ELEMENTS // max(v, 1))
    flat, flat_targets = logits.reshape(b * r, v), targets.reshape(b * r)
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, b * r, rows):
        chunk = (flat[start : start + rows], flat_targets[start : start + rows], temperature)
        if grad:
            parts.append(checkpoint(_chunk_logprobs, *chunk, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*chunk))
    if not parts:
        empty = logits.new_zeros((b, r))
        return empty, empty
    logprobs = torch.cat([p[0] for p in parts]).reshape(b, r)
    entropy = torch.cat([p[1] for p in parts]).reshape(b, r)
    return logprobs, entropy


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature={temperature!r}: expected a number > 0")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature={temperature}: expected a finite number > 0")


def _check_inputs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> None:
    """:func:`token_logprobs`'s argument checks; the id range costs one min/max reduction (one read-back)."""
    _check_temperature(temperature)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        shown = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits: expected a floating-point [B, R, V] tensor, got {shown}")
    if logits.shape[2] == 0:
        raise ValueError(f"logits {tuple(logits.shape)}: the vocabulary is empty (V = 0)")
    if not isinstance(targets, torch.Tensor) or targets.dtype.is_floating_point or targets.dtype.is_complex:
        shown = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ValueError(f"targets: expected an integer tensor, got {shown}")
    if targets.dtype == torch.bool:
        raise ValueError("targets: expected an integer tensor, got torch.bool")
    if targets.shape != logits.shape[:2]:
        raise ValueError(f"targets {tuple(targets.shape)}: expected logits' [B, R] = {tuple(logits.shape[:2])}")
    if targets.numel():
        low, high = torch.stack(torch.aminmax(targets)).tolist()
        if low < 0 or high >= logits.shape[2]:
            raise ValueError(f"targets: ids must lie in [0, {logits.shape[2]}), got {low}..{high}")
