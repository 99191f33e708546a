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

_ROOT = Path(__file__).resolve().parent.parent


def _elsewhere(entry: str) -> bool:
    try:
        return Path(entry or ".").resolve() != _ROOT
    except OSError:
        return True


def hand_over() -> None:
    """Replace ``sys.modules["kernels"]`` (this folder, being imported) by the module of that name found on
    ``sys.path`` without the repository root, or by an empty stand-in; the import statement in progress
    returns the replacement. Raises what the distribution's own ``__init__`` raises."""
    spec = machinery.PathFinder.find_spec("kernels", [entry for entry in sys.path if _elsewhere(entry)])
    sys.modules.pop("kernels._top_level", None)
    if spec is None:
        sys.modules["kernels"] = types.ModuleType("kernels", "stand-in: no 'kernels' distribution is installed")
        return
    module = util.module_from_spec(spec)
    sys.modules["kernels"] = module
    spec.loader.exec_module(module)
