"""Procedurally generated and file-backed verifiable tasks, their rewards and tokenizers (docs/design.md §1)."""

from nibble.tasks.addition import AdditionTask, HeavyTailAdditionTask
from nibble.tasks.answers import FinalAnswer, extract_answer
from nibble.tasks.base import Example, Task
from nibble.tasks.chat import PromptFormat
from nibble.tasks.decoding import decode_response
from nibble.tasks.jsonl import JsonlTask
from nibble.tasks.matching import exact_match, numeric_match
from nibble.tasks.reasoning import ReasoningGymTask
from nibble.tasks.registry import TASKS, get_task
from nibble.tasks.rewards import RewardRunner
from nibble.tasks.tokenizers import CharTokenizer, HFTokenizer, Tokenizer

__all__ = [
    "TASKS",
    "AdditionTask",
    "CharTokenizer",
    "Example",
    "FinalAnswer",
    "HFTokenizer",
    "HeavyTailAdditionTask",
    "JsonlTask",
    "PromptFormat",
    "ReasoningGymTask",
    "RewardRunner",
    "Task",
    "Tokenizer",
    "decode_response",
    "exact_match",
    "extract_answer",
    "get_task",
    "numeric_match",
]
