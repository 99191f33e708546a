"""A reward module whose import hangs: constructing a runner for it must fail, not hang."""

import time

time.sleep(3600)


def reward(prompt: str, response: str, answer: str) -> float:
    return 0.0
