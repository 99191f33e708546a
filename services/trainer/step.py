"""One trainer step in named stages: score the old policy, advantages, loss, backward, optimiser step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from nibble.config import TrainerConfig
from nibble.model import MoETransformer
from nibble.model.scoring import Scores, score
from nibble.rl import (
    correction_ratios,
    group_advantages,
    mismatch_stats,
    policy_loss,
    valid_token_mask,
    zero_std_groups,
)
from nibble.trainer import sharded
from nibble.trainer.batch import Batch
from nibble.trainer.sharded import Shard


@dataclass
class StepResult:
    """What one consumed batch did; floats are means over valid tokens unless named otherwise."""

    loss: float
    grad_norm: float
    skipped_updates: int
    stats: dict[str, float]
    fresh: dict[str, float] | None  # mismatch over staleness-0 tokens; None when the batch has none
    entropy: float
    zero_std_groups: int
    dropped_zero_std_groups: int
    trained_tokens: int
    is_weights: torch.Tensor = field(repr=False)


def old_policy(model: MoETransformer, batch: Batch, shard: Shard | None = None) -> Scores:
    """π_old: the trainer's logprobs of the sampled tokens before any update, with the same quantised
    forward the sampler ran (computed once per consumed batch); ``[B, R]`` like ``batch.mask``.

    With ``shard`` each rank scores its own share of the groups and the ranks' disjoint rows are summed
    into the whole batch on every rank (adding zeros is exact)."""
    with torch.no_grad():
        if shard is None:
            return score(model, batch.prompts, batch.responses, temperature=batch.temperature)
        rows, share = _local_rows(batch, range(batch.num_groups), shard)
        part = score(
            model, [batch.prompts[i] for i in rows], [batch.responses[i] for i in rows], temperature=batch.temperature
        )
        whole = []
        for values in (part.logprobs, part.entropy):
            out = values.new_zeros(batch.mask.shape)
            if share:
                out[rows, : values.shape[1]] = values
            whole.append(sharded.sum_(out))
        return Scores(logprobs=whole[0], entropy=whole[1], mask=batch.mask)


def train_on_batch(
    model: MoETransformer,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: TrainerConfig,
    reference: MoETransformer | None = None,
    shard: Shard | None = None,
) -> StepResult:
    """Run ``config.updates_per_batch`` optimiser steps over whole groups of ``batch``; with
    ``reference`` (a frozen copy of the warm start) a k3 KL penalty of weight ``config.kl_coef`` is added.

    With ``shard`` (an FSDP2-sharded ``model``, :mod:`nibble.trainer.sharded`) every rank passes the same
    ``batch`` and trains on its share of each update's groups (``reference`` sharded alike); the loss
    returned is the whole update's. The batch moves to the model's device first."""
    batch = batch.to(next(model.parameters()).device)
    # Named ranges for torch.profiler (benchmarks/sharded_trainer.py --profile); free when not profiling.
    with record_function("trainer.old_policy"):
        old = old_policy(model, batch, shard)
        ref = old_policy(reference, batch, shard).logprobs if reference is not None else None
    advantages = group_advantages(batch.rewards, batch.group_index)
    group_ids, zero_std = zero_std_groups(batch.rewards, batch.group_index)
    zero = {int(g) for g, z in zip(group_ids.tolist(), zero_std.tolist(), strict=True) if z}
    keep_groups = [g for g in range(batch.num_groups) if not (config.drop_zero_std_groups and g in zero)]
    updates = _split(keep_groups, config.updates_per_batch)
    losses, norms, skipped, stats_list, tokens = [], [], 0, [], 0
    for groups in updates:
        if not len(batch.rows_of_groups(groups)):
            continue
        loss, stats, norm = _update(model, optimizer, batch, old.logprobs, ref, advantages, groups, config, shard)
        if loss is None:
            skipped += 1
            continue
        losses.append(loss)
        norms.append(norm)
        stats_list.append(stats)
        tokens += int(stats["valid_tokens"])
    mask = batch.mask
    fresh_rows = batch.staleness == 0
    level = config.correction_level
    fresh = None
    if bool(fresh_rows.any()):
        fresh = mismatch_stats(
            old.logprobs[fresh_rows], batch.sampler_logprobs[fresh_rows], mask[fresh_rows], correction_level=level
        )
    return StepResult(
        loss=sum(losses) / len(losses) if losses else float("nan"),
        grad_norm=max(norms) if norms else float("nan"),
        skipped_updates=skipped,
        stats=_mean_stats(
            stats_list, mismatch_stats(old.logprobs, batch.sampler_logprobs, mask, correction_level=level)
        ),
        fresh=fresh,
        entropy=float(old.entropy[mask].mean()) if mask.any() else 0.0,
        zero_std_groups=len(zero),
        dropped_zero_std_groups=batch.num_groups - len(keep_groups),
        trained_tokens=tokens,
        is_weights=correction_ratios(old.logprobs, batch.sampler_logprobs, mask),
    )


def _update(model, optimizer, batch: Batch, old_logprobs, ref_logprobs, advantages, groups, config, shard):
    rows = batch.rows_of_groups(groups)
    num_valid, share = None, 1.0
    if shard is not None:
        level = config.correction_level
        num_valid = int(valid_token_mask(batch.sampler_logprobs[rows], batch.mask[rows], correction_level=level).sum())
        rows, share = _local_rows(batch, groups, shard)
    with record_function("trainer.forward"):
        loss, stats = _loss(model, batch, rows, old_logprobs, ref_logprobs, advantages, config, num_valid)
    loss = loss * share
    if shard is not None:
        stats = _whole_update_stats(stats, share)
    optimizer.zero_grad(set_to_none=True)
    finite = bool(torch.isfinite(loss))
    if shard is not None:  # every rank must take the same branch (the backward is collective)
        finite = sharded.all_sum(0.0 if finite else 1.0) == 0.0
    if not finite:
        return None, stats, float("nan")
    with record_function("trainer.backward"):
        (loss if shard is None else loss * sharded.backward_scale(shard)).backward()
    with record_function("trainer.optimizer"):
        norm = sharded.full_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
        if not math.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            return None, stats, norm
        optimizer.step()
    total = loss.item() if shard is None else sharded.all_sum(loss.item())
    return total, stats, norm


def _loss(model, batch: Batch, rows, old_logprobs, ref_logprobs, advantages, config, num_valid):
    """π_θ's teacher-forced forward over ``rows`` and the policy loss (scalar tensor, stats dict)."""
    current = score(
        model, [batch.prompts[i] for i in rows], [batch.responses[i] for i in rows], temperature=batch.temperature
    )
    width = current.logprobs.shape[1]
    return policy_loss(
        current.logprobs,
        old_logprobs[rows, :width],
        batch.sampler_logprobs[rows, :width],
        advantages[rows],
        batch.mask[rows, :width],
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        correction=config.correction,
        correction_level=config.correction_level,
        cap=config.cap,
        ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows, :width],
        kl_coef=config.kl_coef if ref_logprobs is not None else 0.0,
        num_valid_tokens=num_valid,
    )


def _whole_update_stats(stats: dict[str, float], share: float) -> dict[str, float]:
    """One rank's :func:`policy_loss` stats made the whole update's: token counts summed over ranks,
    per-token means re-weighted by each rank's valid tokens (a rank weighted 0 contributes nothing)."""
    counts = ("valid_tokens", "rejected_tokens")
    means = [key for key in stats if key not in counts]
    valid = stats["valid_tokens"] * share
    sums = sharded.all_sums([valid, stats["rejected_tokens"] * share, *(stats[key] * valid for key in means)])
    total = max(sums[0], 1.0)
    return {
        "valid_tokens": int(sums[0]),
        "rejected_tokens": int(sums[1]),
        **{key: value / total for key, value in zip(means, sums[2:], strict=True)},
    }


def _local_rows(batch: Batch, groups, shard: Shard) -> tuple[torch.Tensor, float]:
    """This rank's rows of ``groups`` and their weight; a rank without groups still joins the collectives
    (every forward all-gathers) on one row weighted 0."""
    local = batch.rows_of_groups(shard.local_groups(list(groups)))
    return (local, 1.0) if len(local) else (batch.rows_of_groups(groups)[:1], 0.0)


def _split(groups: list[int], parts: int) -> list[list[int]]:
    size = math.ceil(len(groups) / parts) if groups else 0
    return [groups[i : i + size] for i in range(0, len(groups), size)] if size else []


def _mean_stats(stats_list: list[dict[str, float]], whole: dict[str, float]) -> dict[str, float]:
    """Token-weighted means of per-update stats; the batch's own mismatch over all its valid tokens."""
    out = dict(whole)
    total = sum(s["valid_tokens"] for s in stats_list)
    for key in ("is_clipped_fraction", "ppo_clip_fraction"):
        out[key] = sum(s[key] * s["valid_tokens"] for s in stats_list) / total if total else 0.0
    out["rejected_tokens"] = sum(s["rejected_tokens"] for s in stats_list)
    return out
