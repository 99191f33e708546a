"""One trainer step in named stages: score the old policy, advantages, loss, backward, optimiser step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from nibble.config import TrainerConfig
from nibble.model import MoETransformer
from nibble.model.scoring import Scores, score
from nibble.rl import correction_ratios, group_advantages, mismatch_stats, policy_loss, zero_std_groups
from nibble.trainer.batch import Batch
from nibble.trainer.parallel import SINGLE_PROCESS, Parallelism


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


def old_policy(model: MoETransformer, batch: Batch, parallel: Parallelism = SINGLE_PROCESS) -> Scores:
    """π_old: the trainer's logprobs of the sampled tokens before any update, with the same quantised
    forward the sampler ran (computed once per consumed batch); ``[B, R]`` like ``batch.mask``, on every
    process of ``parallel`` (:meth:`Parallelism.score`)."""
    with torch.no_grad():
        return parallel.score(model, batch)


def train_on_batch(
    model: MoETransformer,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: TrainerConfig,
    reference: MoETransformer | None = None,
    parallel: Parallelism = SINGLE_PROCESS,
) -> StepResult:
    """Run ``config.updates_per_batch`` optimiser steps over whole groups of ``batch``; with
    ``reference`` (a frozen copy of the warm start) a k3 KL penalty of weight ``config.kl_coef`` is added.

    Every process of ``parallel`` passes the same ``batch``; sharded (an FSDP2-sharded ``model``,
    :class:`nibble.trainer.sharded.Shard`) each trains on its share of each update's groups (``reference``
    sharded alike); the loss returned is the whole update's. The batch moves to the model's device first."""
    batch = batch.to(next(model.parameters()).device)
    # Named ranges for torch.profiler (benchmarks/sharded_trainer.py --profile); free when not profiling.
    with record_function("trainer.old_policy"):
        old = old_policy(model, batch, parallel)
        ref = old_policy(reference, batch, parallel).logprobs if reference is not None else None
    advantages = group_advantages(batch.rewards, batch.group_index)
    group_ids, zero_std = zero_std_groups(batch.rewards, batch.group_index)
    zero = {int(g) for g, z in zip(group_ids.tolist(), zero_std.tolist(), strict=True) if z}
    keep_groups = [g for g in range(batch.num_groups) if not (config.drop_zero_std_groups and g in zero)]
    updates = _split(keep_groups, config.updates_per_batch)
    losses, norms, skipped, stats_list, tokens = [], [], 0, [], 0
    for groups in updates:
        if not len(batch.rows_of_groups(groups)):
            continue
        loss, stats, norm = _update(model, optimizer, batch, old.logprobs, ref, advantages, groups, config, parallel)
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


def _update(model, optimizer, batch: Batch, old_logprobs, ref_logprobs, advantages, groups, config, parallel):
    """One optimiser step over ``groups``: (loss, stats, grad norm), loss ``None`` when skipped."""
    rows, share, num_valid = parallel.update_rows(batch, groups, config.correction_level)
    with record_function("trainer.forward"):
        loss, stats = _loss(model, batch, rows, old_logprobs, ref_logprobs, advantages, config, num_valid)
    loss = loss * share
    stats = parallel.update_stats(stats, share)
    optimizer.zero_grad(set_to_none=True)
    if not parallel.all_finite(bool(torch.isfinite(loss))):
        return None, stats, float("nan")
    with record_function("trainer.backward"):
        (loss * parallel.backward_scale()).backward()
    with record_function("trainer.optimizer"):
        norm = parallel.full_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
        if not math.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            return None, stats, norm
        optimizer.step()
    return parallel.all_sum(loss.item()), stats, norm


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
