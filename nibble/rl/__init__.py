"""The RL objective of DESIGN.md §4: group advantages, the corrected clipped policy loss, KL estimators."""

from nibble.rl.advantages import group_advantages, zero_std_groups

__all__ = [
    "group_advantages",
    "zero_std_groups",
]
