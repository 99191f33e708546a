"""Whether registers bound the four-over-six quantise, on the GPU machine.

The launched kernel compiles both 4/6 error forms behind a per-program branch (the exact one for rows
beyond about 2^±100) and gets the registers of the larger: 96 against 72 for the fast form alone
(``python -m benchmarks.quantize_sass``). This times, side by side in one run on randn bf16 per-token
rows (every row a fast row, so every variant gives the reference's bits, checked):

- the launched kernel;
- the same kernel capped at 80 and 72 registers (Triton's ``maxnreg``: the compiler spills the rest to
  local memory, mostly the exact form's values);
- a copy whose 4/6 branch always takes the fast form (:func:`benchmarks.quantize_sass.kernel_module`:
  72 registers, no spills). It gives wrong bits on extreme rows, so it is not a design: its time is the
  ceiling of any launch that keeps the exact form out of the fast kernel's registers.

    python -m benchmarks.quantize_registers_gpu --out benchmarks/results/h200_quantize_registers.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, write_record
from benchmarks.quantize_launch_gpu import same_as_reference
from benchmarks.quantize_sass import kernel_module
from nibble.kernels.gpu import nvfp4 as gpu_nvfp4

SHAPES = ((8192, 7168), (32, 7168))
MODES = (("standard", None), ("mse", "mse"))


class Capped:
    """``kernel[grid](...)`` with ``maxnreg`` added to the launch options."""

    def __init__(self, kernel, registers: int) -> None:
        self.kernel, self.registers = kernel, registers

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **kwargs, maxnreg=self.registers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/quantize_registers_gpu.py needs a CUDA GPU")
    launched = gpu_nvfp4.nvfp4_quantize_kernel
    variants = {
        "launched": launched,
        "maxnreg80": Capped(launched, 80),
        "maxnreg72": Capped(launched, 72),
        "fast_only": kernel_module(True).nvfp4_quantize_kernel,
    }
    torch.manual_seed(0)
    rows = {}
    try:
        for m, k in SHAPES:
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(m * k * 2))]
            for mode, fos in MODES:
                for name, kernel in variants.items():
                    if fos is None and name != "launched":
                        continue  # the standard path has no 4/6 branch: one kernel
                    gpu_nvfp4.nvfp4_quantize_kernel = kernel  # the launcher calls the module-level name
                    identical = same_as_reference(xs[0], True, fos, None)
                    t = graph_time(
                        lambda i, xs=xs, fos=fos: gpu_nvfp4.quantize(xs[i], per_token=True, four_over_six=fos),
                        len(xs), iters=20 if m > 100 else 50,
                    )["graph_s"]  # fmt: skip
                    rows[f"{m}x{k} {mode} {name}"] = {"seconds": t, "bit_identical": identical}
                    print(f"{m}x{k} {mode:8s} {name:10s} {t * 1e6:8.2f} us bit-identical {identical}", flush=True)
            del xs
    finally:
        gpu_nvfp4.nvfp4_quantize_kernel = launched
    result = {"machine": describe(), "command": "python -m benchmarks.quantize_registers_gpu", "rows": rows}
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
