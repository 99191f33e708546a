"""Teacher-forced scoring: the trainer's logprobs and entropies of given response tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nibble.model.transformer import MoETransformer
from nibble.recipe.compute import log_softmax


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
        ValueError: mismatched list lengths, an empty prompt, ``temperature <= 0``, or a sequence
            longer than the model's context.
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 when scoring")
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
    logits = model(ids, positions=positions, attention_mask=valid)[:, p_width - 1 : p_width + r_width - 1]
    logp_all = log_softmax(logits / temperature)
    targets = ids[:, p_width:]
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return Scores(logprobs=logprobs, entropy=entropy, mask=mask)
