"""Throughput of the reference NVFP4/MXFP8 quantisers on a 4096×4096 float32 tensor (CPU).

Prints elements/second for each operation (best of --repeats) and records them, with the machine,
in benchmarks/results/formats_cpu.json. Floors from the formats issue: ≥ 15 M elements/s for standard
per-token NVFP4 quantisation, ≥ 5 M elements/s with four-over-six.

    .venv/bin/python -m benchmarks.formats_cpu
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.machine import describe, write_record
from nibble.kernels import mxfp8, nvfp4

FLOORS = {"nvfp4_quantize_per_token": 15e6, "nvfp4_quantize_per_token_4o6_mse": 5e6}


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: allocator and thread pool
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "formats_cpu.json")
    args = parser.parse_args()

    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0))
    q = nvfp4.quantize(x, scale="per_token")
    cases = {
        "nvfp4_quantize_per_token": lambda: nvfp4.quantize(x, scale="per_token"),
        "nvfp4_quantize_per_token_no_validate": lambda: nvfp4.quantize(x, scale="per_token", validate=False),
        "nvfp4_quantize_per_token_4o6_mse": lambda: nvfp4.quantize(x, scale="per_token", four_over_six="mse"),
        "nvfp4_quantize_per_token_4o6_mae": lambda: nvfp4.quantize(x, scale="per_token", four_over_six="mae"),
        "nvfp4_dequantize": q.dequantize,
        "mxfp8_quantize_rceil": lambda: mxfp8.quantize(x),
    }
    results = {}
    for name, fn in cases.items():
        rate = x.numel() / best_seconds(fn, args.repeats)
        floor = FLOORS.get(name)
        results[name] = {
            "elements_per_second": rate,
            "floor": floor,
            "meets_floor": None if floor is None else rate >= floor,
        }
        verdict = "" if floor is None else f"  (floor {floor / 1e6:.0f} M/s: {'met' if rate >= floor else 'MISSED'})"
        print(f"{name:40s} {rate / 1e6:8.1f} M elements/s{verdict}")
    record = {
        "benchmark": "formats_cpu",
        "shape": [args.size, args.size],
        "dtype": "float32",
        "machine": describe(),
        "results": results,
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
