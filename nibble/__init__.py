"""Nibble: asynchronous, disaggregated RL for language models with NVFP4 rollouts.

Subpackages hold one concern each (docs/design.md §1); this module imports none of them so that entry
points can parse their configuration before paying for heavy imports.
"""

__version__ = "0.1.0"
