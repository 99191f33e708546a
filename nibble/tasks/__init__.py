"""Procedurally generated and file-backed verifiable tasks, their rewards and tokenizers (DESIGN.md §1)."""

from nibble.tasks.addition import AdditionTask
from nibble.tasks.base import Example, Task
from nibble.tasks.matching import exact_match, numeric_match
from nibble.tasks.rewards import RewardRunner
from nibble.tasks.tokenizers import CharTokenizer, HFTokenizer, Tokenizer

__all__ = [
    "AdditionTask",
    "CharTokenizer",
    "Example",
    "HFTokenizer",
    "RewardRunner",
    "Task",
    "Tokenizer",
    "exact_match",
    "numeric_match",
]
