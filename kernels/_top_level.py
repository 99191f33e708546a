"""What a top-level ``import kernels`` gets when the repository root is on ``sys.path``: the installed
``kernels`` distribution (Hugging Face's), or a stand-in empty module where none is installed.

Without this, ``from kernels import CUDAProperties`` (transformers >= 5.25, at ``import transformers``'s
model classes) finds Nibble's ``kernels/`` folder first and fails; an empty stand-in (no ``__file__``, no
``__version__``) is what transformers' availability check reads as a folder shadowing on ``sys.path``
and skips, rather than a second copy of Nibble's kernels under another name.
"""

from __future__ import annotations

import sys
import types
from importlib import machinery, util
from pathlib import Path


def _elsewhere(entry: str) -> bool:
    """Whether ``entry`` may hold the distribution: not this root, nor another Nibble checkout's (two checkouts
    on ``sys.path`` would otherwise hand the name to each other without end)."""
    try:
        return not (Path(entry or ".") / "kernels" / "_top_level.py").exists()
    except (OSError, TypeError):
        return False


def hand_over() -> None:
    """Replace ``sys.modules["kernels"]`` (this folder, being imported) by the module of that name found on
    ``sys.path`` outside every Nibble checkout, or by an empty stand-in; the import statement in progress
    returns the replacement. Raises what the distribution's own ``__init__`` raises."""
    spec = machinery.PathFinder.find_spec("kernels", [entry for entry in sys.path if _elsewhere(entry)])
    sys.modules.pop("kernels._top_level", None)
    if spec is None:
        stand_in = types.ModuleType("kernels", "stand-in: no 'kernels' distribution is installed")
        stand_in.__spec__ = machinery.ModuleSpec("kernels", None)  # so that importlib.util.find_spec still answers
        sys.modules["kernels"] = stand_in
        return
    module = util.module_from_spec(spec)
    sys.modules["kernels"] = module
    spec.loader.exec_module(module)
