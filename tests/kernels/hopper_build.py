"""Compile the Triton kernels for Hopper (sm_90) on a machine without a GPU.

Triton's interpreter runs a kernel's Python directly, so it accepts code that the compiler rejects (a loop
variable whose type changes between iterations, a constexpr used as a tensor); such a kernel passes every
CPU test and fails at its first launch on the GPU. ``record_launches`` notes each launch made under the
interpreter (kernel, argument types, constexpr values, launch options); ``compile_for_hopper`` hands them
to Triton's real compiler in a process without ``TRITON_INTERPRET`` and builds each to a cubin for
``GPUTarget("cuda", 90, 32)`` (the frontend, the GPU passes, LLVM and ``ptxas``, as the first launch on an
H100/H200 would). Run as a module, it compiles the launches pickled on its stdin and pickles the failures to the path
given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HOPPER = ("cuda", 90, 32)
_ROOT = Path(__file__).resolve().parents[2]
# keyword arguments of a launch that are compiler options, not kernel parameters
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "maxnreg")


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel specialisation: ``module.name`` with ``signature`` (parameter -> Triton type string, e.g.
    ``*bf16``, ``i32``, ``constexpr``), ``constexprs`` (parameter -> value) and compiler ``options``."""

    module: str
    name: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...]
    options: tuple[tuple[str, object], ...]

    def describe(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.constexprs)})"


def _launch(fn, args: tuple, kwargs: dict) -> Launch:
    import triton.language as tl
    from triton.runtime.jit import mangle_type

    params = inspect.signature(fn).parameters
    bound = inspect.signature(fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params})
    bound.apply_defaults()
    signature, constexprs = [], []
    for name, param in params.items():
        value = bound.arguments[name]
        annotation = str(param.annotation).removeprefix("tl.")
        if "constexpr" in annotation or value is None:
            signature.append((name, "constexpr"))
            constexprs.append((name, value))
        elif param.annotation is inspect.Parameter.empty:
            signature.append((name, mangle_type(value)))
        else:  # an annotated scalar type (``tl.float64``) fixes the parameter's type
            signature.append((name, str(getattr(tl, annotation, annotation))))
    options = tuple((k, kwargs[k]) for k in _OPTIONS if k in kwargs)
    return Launch(fn.__module__, fn.__name__, tuple(signature), tuple(constexprs), options)


@contextlib.contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Within the block, note every interpreted kernel launch (it still runs); yields the list, in launch
    order without repeats. Raises RuntimeError outside the interpreter (``TRITON_INTERPRET=1``)."""
    from triton.runtime.interpreter import InterpretedFunction

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("record_launches needs Triton's interpreter (TRITON_INTERPRET=1)")
    launches: list[Launch] = []
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        launch = _launch(self.fn, args, kwargs)
        if launch not in launches:
            launches.append(launch)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording_run
    try:
        yield launches
    finally:
        InterpretedFunction.run = run


def compile_for_hopper(launches: list[Launch], timeout_s: float = 600.0) -> dict[str, str]:
    """Build each launch to a cubin for sm_90 in a fresh process; returns ``{describe(): error}`` for those
    the compiler rejects (empty when all build). ``timeout_s`` bounds the whole build (seconds)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "failures.pickle"
        done = subprocess.run(
            [sys.executable, "-m", "tests.kernels.hopper_build", str(report)],
            input=pickle.dumps(launches),
            capture_output=True,
            cwd=_ROOT,
            env=env,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the Hopper build process failed:\n{done.stderr.decode()[-4000:]}")
        return pickle.loads(report.read_bytes())


def _build(launch: Launch) -> None:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(launch.module), launch.name)
    names = fn.arg_names
    constexprs = {(names.index(k),): v for k, v in launch.constexprs}
    source = ASTSource(fn=fn, signature=dict(launch.signature), constexprs=constexprs)
    triton.compile(source, target=GPUTarget(*HOPPER), options=dict(launch.options))


def main() -> None:
    failures = {}
    for launch in pickle.loads(sys.stdin.buffer.read()):
        try:
            _build(launch)
        except Exception as error:
            failures[launch.describe()] = f"{type(error).__name__}: {error}"
    Path(sys.argv[1]).write_bytes(pickle.dumps(failures))


if __name__ == "__main__":
    main()
