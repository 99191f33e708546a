"""Batch assembly: whole GRPO groups from the stream into padded tensors (docs/design.md §4–5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from nibble.wire import pb


@dataclass
class Batch:
    """Rows are responses, ``R`` the longest response; groups are never split.

    Attributes:
        prompts: prompt token ids per row.
        responses: response token ids per row.
        sampler_logprobs: float32 ``[B, R]`` μ (0 on padding).
        mask: bool ``[B, R]``, True on real response tokens.
        rewards: float32 ``[B]``.
        group_index: int64 ``[B]``, which group of the batch a row belongs to.
        staleness: int64 ``[B]``, trainer version − the group's policy version.
        trajectory_ids: per row.
        truncated: bool ``[B]``, the response hit the length limit.
        temperature: the sampling temperature (one per batch; groups with another are refused upstream).
    """

    prompts: list[list[int]]
    responses: list[list[int]]
    sampler_logprobs: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor
    group_index: torch.Tensor
    staleness: torch.Tensor
    trajectory_ids: list[str]
    truncated: torch.Tensor
    temperature: float

    @property
    def num_groups(self) -> int:
        return int(self.group_index.max()) + 1 if len(self.group_index) else 0

    def rows_of_groups(self, groups: Sequence[int]) -> torch.Tensor:
        """Row indices (int64, CPU: they also index the token lists) of the given groups, for splitting
        into updates of whole groups."""
        wanted = torch.as_tensor(list(groups), dtype=torch.long, device=self.group_index.device)
        return torch.isin(self.group_index, wanted).nonzero().flatten().cpu()

    def to(self, device: torch.device | str) -> Batch:
        """This batch with every tensor on ``device`` (the model's: the loss mixes both)."""
        tensors = ("sampler_logprobs", "mask", "rewards", "group_index", "staleness", "truncated")
        return replace(self, **{name: getattr(self, name).to(device) for name in tensors})


def assemble(groups: Sequence[pb.TrajectoryGroup], trainer_version: int) -> Batch:
    """Pad ``groups`` into a :class:`Batch`.

    Raises:
        ValueError: no groups, or groups sampled at different temperatures (the trainer scores with one T).
    """
    if not groups:
        raise ValueError("assemble: no groups")
    temperatures = {round(g.temperature, 9) for g in groups}
    if len(temperatures) != 1:
        raise ValueError(f"groups sampled at different temperatures {sorted(temperatures)}")
    rows = [(gi, g, r) for gi, g in enumerate(groups) for r in g.responses]
    width = max(len(r.tokens) for _, _, r in rows)
    mu = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (_, _, r) in enumerate(rows):
        n = len(r.tokens)
        mu[i, :n] = torch.tensor(list(r.logprobs), dtype=torch.float32)
        mask[i, :n] = True
    return Batch(
        prompts=[list(g.prompt_tokens) for _, g, _ in rows],
        responses=[list(r.tokens) for _, _, r in rows],
        sampler_logprobs=mu,
        mask=mask,
        rewards=torch.tensor([r.reward for _, _, r in rows], dtype=torch.float32),
        group_index=torch.tensor([gi for gi, _, _ in rows]),
        staleness=torch.tensor([trainer_version - g.policy_version for _, g, _ in rows]),
        trajectory_ids=[r.trajectory_id for _, _, r in rows],
        truncated=torch.tensor([r.finish_reason == pb.LENGTH for _, _, r in rows]),
        temperature=float(groups[0].temperature),
    )
