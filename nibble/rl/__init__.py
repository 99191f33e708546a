"""The RL objective of docs/design.md §4: group advantages, the corrected clipped policy loss, KL estimators."""

from nibble.rl.advantages import group_advantages, zero_std_groups
from nibble.rl.correction import correction_ratios, correction_weights, mismatch_stats, valid_token_mask
from nibble.rl.kl import k3
from nibble.rl.loss import policy_loss

__all__ = [
    "correction_ratios",
    "correction_weights",
    "group_advantages",
    "k3",
    "mismatch_stats",
    "policy_loss",
    "valid_token_mask",
    "zero_std_groups",
]
