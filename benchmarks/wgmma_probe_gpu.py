"""Which operand layouts a block-ordered ``wgmma`` gemm can rely on, asked of the GPU (Hopper, ``sm_90a``).

docs/gpu-kernels.md's note on a ``wgmma`` gemm, and the warpgroup-MMA gemm written after it, rest on what this
probe asks of the GPU: that ``wgmma``'s register operand A takes, per warp, ``mma.m16n8k16``'s A layout (so the
weights' fragment layout feeds it as it feeds ``mma.sync``), that its result registers follow the layout
``d_matrix`` reads, and how a shared-memory descriptor without swizzle names its two byte offsets for a K-major
B. One ``wgmma.m64n16k16`` with a zero accumulator (``benchmarks/wgmma_probe.cu``) multiplies small integers,
exact in float16 and float32, under each reading of the descriptor, and the result is compared bit for bit with
``A @ B.T``. (The fragment layout's K order, ``fragment_gemm.FRAGMENT_K_ORDER``, is a relabelling applied to
both operands, which no product of this kind can reveal; tests/kernels/test_wgmma_emulation.py ties it to the
layout.) The readings agree with CUTLASS's (``make_gmma_desc``: a K-major tile without swizzle steps its 8-row
core-matrix groups by the stride byte offset and its two K halves by the leading one; ``ALayout_64x16`` and
``CLayout_64xN`` are the register layouts written here), which is the reading the kernel's unswizzled layout
takes (``WG_LEADING`` of fragment_gemm.cu: the leading byte offset along K).

Then the warpgroup-MMA gemm itself (``gemm.wgmma_matmul``) runs under each of its shared-memory layouts
(``fragment_gemm.WGMMA_SWIZZLES``: no swizzle, read as above, and wgmma's 32- and 128-byte swizzles) on shapes off
its tiles and is compared bit for bit with gemm (``fragment_matmul``, whose bits the GPU tests tie to the CPU
reference), each layout in a process of its own, so that a fault under one (a sticky CUDA error) leaves the
others' answers. (On the H100 on 2026-12-07 the descriptor read with the leading byte offset along K gave the same
bits, and the unswizzled gemm too; read along N, the gemm faulted: ``h100_wgmma_probe.json``.)
Run on the GPU machine:

    python -m benchmarks.wgmma_probe_gpu --out benchmarks/results/h100_wgmma_probe_swizzles.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.machine import describe, out_problem, write_record
from nibble.kernels.gpu import fragment_gemm

SOURCE = Path(__file__).with_name("wgmma_probe.cu")
REPOSITORY = Path(__file__).resolve().parents[1]
N = 16  # the probe's wgmma N
# (rows, weight rows, K): a whole 128-row tile; rows, column groups and K off the tiles, K ending inside a step;
# chunks of K ending inside a step.
GEMM_SHAPES = ((128, 128, 1024), (300, 272, 2064), (129, 520, 4112))
GEMM_TIMEOUT_S = 300


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


def gemm_rows(swizzle: int) -> list[dict]:
    """The warpgroup-MMA gemm with one shared-memory layout against gemm's bits (float32 output) on
    :data:`GEMM_SHAPES`: per shape the outputs whose bits differ."""
    from benchmarks.gemm_backends_gpu import packed_activations, packed_weights
    from nibble.kernels.gpu import gemm as gpu_gemm

    rows = []
    for m, n, k in GEMM_SHAPES:
        qw, qx = packed_weights(n, k, copies=1)[0], packed_activations(m, k)
        expected = gpu_gemm.fragment_matmul(qx, qw, torch.float32, gemv=False)
        got = gpu_gemm.wgmma_matmul(qx, qw, torch.float32, swizzle=swizzle)
        rows.append(
            {"shape": [m, n, k], "wrong_outputs": int((got.view(torch.int32) != expected.view(torch.int32)).sum())}
        )
    return rows


def _child_error(stderr: str, returncode: int) -> str:
    """The exception line of a failed child's ``stderr`` (PyTorch follows a CUDA error with lines of advice, so the
    last line is not it), with its exit status."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"[\w.]*(Error|Exception|Interrupt)\b", line)]
    return f"{(raised or lines or ['no message'])[-1]} (exit status {returncode})"


def gemm_layout(swizzle: int) -> dict:
    """:func:`gemm_rows` in a child process (a fault there is reported, not raised), run from the repository root."""
    child = f"import json; from benchmarks.wgmma_probe_gpu import gemm_rows; print(json.dumps(gemm_rows({swizzle})))"
    row = {"swizzle": swizzle}
    try:
        run = subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, timeout=GEMM_TIMEOUT_S, cwd=REPOSITORY
        )
    except subprocess.TimeoutExpired:
        return row | {"error": f"no answer within {GEMM_TIMEOUT_S} s"}
    if run.returncode:
        return row | {"error": _child_error(run.stderr, run.returncode)}
    try:
        shapes = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return row | {"error": f"the child printed no result: {run.stdout.strip()[-200:]!r}"}
    return row | {"same_bits": all(s["wrong_outputs"] == 0 for s in shapes), "shapes": shapes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    args = parser.parse_args()
    if args.out is not None and (problem := out_problem(args.out)):
        parser.error(f"--out {args.out}: {problem}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("benchmarks/wgmma_probe_gpu.py needs a Hopper GPU (compute capability 9.0)")
    # the gemm first, in children, before this process makes a context of its own (a GPU in exclusive-process mode
    # takes one at a time)
    gemms = [gemm_layout(swizzle) for swizzle in fragment_gemm.WGMMA_SWIZZLES]
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
    for row in gemms:
        verdict = row.get("error") or (
            "same bits as gemm on every shape" if row["same_bits"]
            else ", ".join(f"{s['shape']}: {s['wrong_outputs']} outputs wrong" for s in row["shapes"])
        )  # fmt: skip
        print(f"wgmma gemm, swizzle {row['swizzle']}: {verdict}")
    if args.out:
        record = {"machine": describe(), "command": "python -m benchmarks.wgmma_probe_gpu", "probes": results}
        write_record(args.out, record | {"gemms": gemms})


if __name__ == "__main__":
    main()
