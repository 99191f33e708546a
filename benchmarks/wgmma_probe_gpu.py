"""Which operand layouts a block-ordered ``wgmma`` gemm can rely on, asked of the GPU (Hopper, ``sm_90a``).

docs/gpu-kernels.md's note on a ``wgmma`` gemm, and the warpgroup-MMA gemm written after it, rest on what no run
here has shown yet: that ``wgmma``'s register operand A takes, per warp, ``mma.m16n8k16``'s A layout (so the
weights' fragment layout feeds it as it feeds ``mma.sync``), that its result registers follow the layout
``d_matrix`` reads, and how a shared-memory descriptor without swizzle names its two byte offsets for a K-major
B. One ``wgmma.m64n16k16`` with a zero accumulator (``benchmarks/wgmma_probe.cu``) multiplies small integers,
exact in float16 and float32, under each reading of the descriptor, and the result is compared bit for bit with
``A @ B.T``. (The fragment layout's K order, ``fragment_gemm.FRAGMENT_K_ORDER``, is a relabelling applied to
both operands, which no product of this kind can reveal; tests/kernels/test_wgmma_emulation.py ties it to the
layout.) Run on the GPU machine:

    python -m benchmarks.wgmma_probe_gpu --out benchmarks/results/h100_wgmma_probe.json
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

from benchmarks.machine import describe, out_problem, write_record

SOURCE = Path(__file__).with_name("wgmma_probe.cu")
N = 16  # the probe's wgmma N


def _pairs(values: torch.Tensor) -> torch.Tensor:
    """float16 ``[..., 2]`` as one 32-bit word each (int32 ``[...]``), the first element in the low half."""
    bits = values.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return bits[..., 0] | (bits[..., 1] << 16)


def a_registers(a: torch.Tensor) -> torch.Tensor:
    """A float16 ``[64, 16]`` as the warpgroup's register operand, int32 ``[128, 4]``: thread ``t`` of warp
    ``w = t // 32`` (rows ``16w..16w+15``), ``g = (t % 32) // 4``, ``c = t % 4`` holds rows ``16w + g`` and
    ``16w + g + 8`` at columns ``2c, 2c+1`` (registers 0, 1) and ``2c+8, 2c+9`` (2, 3): ``mma.m16n8k16``'s A
    layout (PTX ISA)."""
    t = torch.arange(128)
    row = 16 * (t // 32) + (t % 32) // 4
    col = 2 * (t % 4)
    words = []
    for dr, dc in ((0, 0), (8, 0), (0, 8), (8, 8)):
        pair = torch.stack((a[row + dr, col + dc], a[row + dr, col + dc + 1]), dim=-1)
        words.append(_pairs(pair))
    return torch.stack(words, dim=1)


def d_matrix(d_out: torch.Tensor) -> torch.Tensor:
    """The result float32 ``[64, N]`` from the threads' registers ``[128, N // 2]``: register ``4i + 2h + e`` of
    thread ``t`` is row ``16 (t // 32) + (t % 32) // 4 + 8h``, column ``8i + 2 (t % 4) + e`` (PTX ISA)."""
    d = torch.empty(64, N, dtype=torch.float32)
    for t, r in itertools.product(range(128), range(N // 2)):
        i, h, e = r // 4, (r // 2) % 2, r % 2
        d[16 * (t // 32) + (t % 32) // 4 + 8 * h, 8 * i + 2 * (t % 4) + e] = d_out[t, r]
    return d


def source() -> str:
    return f"#define N {N}\n" + SOURCE.read_text()


def probe(kernel, a: torch.Tensor, b: torch.Tensor, leading_is_k: bool) -> dict:
    """One wgmma of ``a [64, 16]`` and ``b [N, 16]`` (float16, CPU; B one row per output column, K contiguous)
    with the descriptor read as ``leading_is_k`` says."""
    regs = a_registers(a).cuda()
    rows = b.contiguous().view(torch.int16).cuda()
    d_out = torch.zeros(128, N // 2, dtype=torch.float32, device="cuda")
    kernel(grid=(1, 1, 1), block=(128, 1, 1), args=[regs, rows, d_out, int(leading_is_k)])
    torch.cuda.synchronize()
    got, expected = d_matrix(d_out.cpu()), a.float() @ b.float().T
    return {
        "leading_offset": "K" if leading_is_k else "N",
        "same_bits": torch.equal(got, expected),
        "wrong_outputs": int((got != expected).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    args = parser.parse_args()
    if args.out is not None and (problem := out_problem(args.out)):
        parser.error(f"--out {args.out}: {problem}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("benchmarks/wgmma_probe_gpu.py needs a Hopper GPU (compute capability 9.0)")
    kernel = torch.cuda._compile_kernel(source(), "wgmma_probe", compute_capability="90a")
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-4, 5, (64, 16), generator=generator).to(torch.float16)
    b = torch.randint(-4, 5, (N, 16), generator=generator).to(torch.float16)
    results = [probe(kernel, a, b, leading_is_k) for leading_is_k in (True, False)]
    for row in results:
        print(
            f"leading byte offset along {row['leading_offset']}: "
            f"{'same bits as A @ B.T' if row['same_bits'] else str(row['wrong_outputs']) + ' outputs wrong'}"
        )
    if args.out:
        write_record(
            args.out, {"machine": describe(), "command": "python -m benchmarks.wgmma_probe_gpu", "probes": results}
        )


if __name__ == "__main__":
    main()
