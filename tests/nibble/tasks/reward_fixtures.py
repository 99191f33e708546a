"""Reward functions for the custom-reward tests, named as ``tests.nibble.tasks.reward_fixtures:NAME``."""

import os
import time


def behaves(prompt: str, response: str, answer: str) -> object:
    """Misbehaves as ``response`` says ("raise", "hang", "nan", "inf", "string", "exit", "print"), else: correct."""
    if response == "raise":
        raise RuntimeError("reward function failed")
    if response == "hang":
        time.sleep(3600)
    if response in ("nan", "inf"):
        return float(response)
    if response == "string":
        return "1.0"
    if response == "exit":
        os._exit(3)
    if response == "print":
        print("a reward function that prints must not corrupt the worker's replies")
        return 0.5
    return float(response == answer)


not_callable = 42


def spawns_and_hangs(prompt: str, response: str, answer: str) -> float:
    """Starts a long-lived child (its pid written to ``response``, a file path), then hangs."""
    import subprocess

    child = subprocess.Popen(["sleep", "3600"])
    with open(response, "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)
    return 1.0
