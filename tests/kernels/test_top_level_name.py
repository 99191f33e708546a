"""The repository's ``kernels/`` folder must not shadow the ``kernels`` distribution (docs/design.md §1).

Run from the repository root (``python -m pytest``, ``python -m benchmarks...``) the root is on ``sys.path``
and the folder is importable as a top-level ``kernels``; transformers >= 5.25 imports Hugging Face's
``kernels`` at ``from transformers import PreTrainedModel``. Each check runs a fresh interpreter from the root.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, *flags: str, pythonpath: Path | None = None) -> str:
    # the root first on sys.path, as pytest and `python -m` put it: no PYTHONSAFEPATH, no inherited PYTHONPATH
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_transformers_model_classes_import_from_the_repository_root():
    # the failure this guards against: ImportError: cannot import name 'CUDAProperties' from 'kernels'
    python("from transformers import PreTrainedModel")


def test_a_top_level_kernels_import_gets_the_installed_distribution(tmp_path):
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHOSE = 'the distribution'\nfrom . import layers\n")
    (site / "kernels" / "layers.py").write_text("")
    out = python(
        """
        import kernels, kernels.layers
        import nibble.kernels
        print(kernels.WHOSE, kernels.__file__, nibble.kernels.NVFP4Tensor.__module__)
        """,
        pythonpath=site,
    )
    whose, where, ours = out.rsplit(" ", 2)
    assert whose == "the distribution" and Path(where) == site / "kernels" / "__init__.py"
    assert ours.strip() == "nibble.kernels.tensors"


def test_without_the_distribution_the_name_is_an_empty_stand_in():
    # -S: no site-packages, so no kernels distribution (and no Nibble install: only the root's folder)
    code = """
        import importlib.util, kernels
        print(hasattr(kernels, '__file__'), hasattr(kernels, 'nvfp4'), importlib.util.find_spec('kernels').origin)
        print(kernels.__doc__)
        """
    out = python(code, "-S")
    assert out.split()[:4] == ["False", "False", "None", "stand-in:"]


def test_a_second_checkout_on_the_path_is_passed_over(tmp_path):
    other = tmp_path / "other_checkout" / "kernels"
    other.mkdir(parents=True)
    for name in ("__init__.py", "_top_level.py"):
        (other / name).write_text((ROOT / "kernels" / name).read_text())
    out = python("import kernels; print(kernels.__doc__)", "-S", pythonpath=other.parent)
    assert out.startswith("stand-in:")
