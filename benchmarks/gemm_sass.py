"""Instruction counts of the fragment gemm's main loop (one step of 128 elements of K), compiled for sm_90 without
a GPU: NVRTC from the ``nvidia-cuda-nvrtc-cu12`` dev dependency (``tests/kernels/cuda_build.py``), disassembled
with Triton's bundled ``nvdisasm``. The loop runs from the label before its ``DEPBAR`` (the wait for the step's
copies) to the branch back to it; its float32 adds (``FADD``, one per block and output: the block order of
docs/design.md §2.6) against its tensor-core instructions (``HMMA``) are what bound gemm at many rows.

    python -m benchmarks.gemm_sass [--tiles 2,4,8 1,2,4] [--wgmma]
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
import subprocess
import tempfile
from pathlib import Path

import triton

from benchmarks.gemm_pipeline_gpu import tile
from benchmarks.options import AddUp
from nibble.kernels.gpu import fragment_gemm
from tests.kernels.cuda_build import compile_cubin

NVDISASM = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def loop_opcodes(gemm: fragment_gemm.GemmTile) -> collections.Counter:
    """Opcode counts (without modifiers) of gemm's main loop for tile ``gemm`` (dense, bf16 output)."""
    source = fragment_gemm.source(fragment_gemm.GEMV_TILES[0], False, False, True, gemm)
    return _loop(compile_cubin(source, fragment_gemm.NVRTC_OPTIONS, 90)[0], "nvfp4_fragment_gemm")


@functools.cache
def _wgmma_cubin(swizzle: int) -> bytes:
    source = fragment_gemm.wgmma_source(fragment_gemm.WGMMA_STAGES, swizzle, True)
    return compile_cubin(source, fragment_gemm.NVRTC_OPTIONS, "90a")[0]


def wgmma_loop_opcodes(whole_steps: bool = False, swizzle: int = 0) -> collections.Counter:
    """Opcode counts of the warpgroup-MMA gemm's main loop (sm_90a, default stages, bf16 output, shared-memory
    layout ``swizzle``): both copy paths, or with ``whole_steps`` the path of a step that lies inside K (every step
    but a last one ending past K)."""
    return _loop(_wgmma_cubin(swizzle), "nvfp4_fragment_wgmma", whole_steps)


def _loop(cubin: bytes, kernel: str, whole_steps: bool = False) -> collections.Counter:
    """Opcode counts of ``kernel``'s main loop in ``cubin``: from the label before its ``DEPBAR`` (the wait for the
    step's copies) to the branch back to it. ``whole_steps``: less the general copies, which the first branch after
    the loop's barrier jumps to and which end at the label that the whole-step copies jump to over them.

    Raises:
        ValueError: ``whole_steps`` and the loop does not have that shape.
    """
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        sass = subprocess.run([NVDISASM, "-c", file.name], capture_output=True, text=True, check=True).stdout
    start = sass.index(f".text.{kernel}:")
    end = sass.find("\n.text.", start + 1)
    lines = sass[start : end if end > 0 else None].splitlines()
    wait = next(i for i, line in enumerate(lines) if "DEPBAR.LE" in line)
    head = max(i for i in range(wait) if re.match(r"\s*\.L_x_\d+:", lines[i]))
    label = lines[head].strip().rstrip(":")
    tail = max(i for i, line in enumerate(lines) if f"`({label})" in line)
    loop = lines[head : tail + 1]
    if whole_steps:
        loop = without_general_copies(loop)
    body = [line for line in loop if _ADDRESS.search(line)]
    ops = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", line).split()[0] for line in body]
    return collections.Counter(op.split(".")[0] for op in ops)


def _label_target(line: str) -> str | None:
    found = re.search(r"`\((\.L_x_\d+)\)", line)
    return found.group(1) if found else None


def without_general_copies(loop: list[str]) -> list[str]:
    """``loop`` (SASS lines) less the span from the first branch target after its ``BAR.SYNC`` to the target of
    the unconditional branch just before that span: the general copies, which must be the longer of the two paths
    (their bounds checks), else the paths were laid out the other way round.

    Raises:
        ValueError: the loop has no such branch, or the span left out is not the longer path.
    """
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(loop) if re.match(r"\s*\.L_x_\d+:", line)}
    try:
        barrier = next(i for i, line in enumerate(loop) if re.search(r"\bBAR\.SYNC\b", line))
        branch = next(i for i in range(barrier, len(loop)) if " BRA " in loop[i])
        general = labels[_label_target(loop[branch])]
        jump = next(line for line in reversed(loop[:general]) if _ADDRESS.search(line))
        if not re.search(r"\*/\s+BRA ", jump):  # unconditional: no predicate before the opcode
            raise ValueError(f"the line before the general copies is not an unconditional branch: {jump.strip()}")
        after = labels[_label_target(jump)]
    except (StopIteration, KeyError):
        raise ValueError("the loop has no branch over general copies after its barrier") from None
    if after <= general:
        raise ValueError("the whole-step copies branch backwards")
    kept, left_out = (
        sum(1 for line in span if _ADDRESS.search(line)) for span in (loop[branch:general], loop[general:after])
    )
    if left_out <= kept:
        raise ValueError(f"the span left out ({left_out} instructions) is not the longer copy path ({kept})")
    return loop[:general] + loop[after:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tiles", action=AddUp, type=tile, default=list(fragment_gemm.GEMM_TILES),
        help="gemm tiles GROUPS,STAGES,WARPS to count (default: fragment_gemm.GEMM_TILES)",
    )  # fmt: skip
    parser.add_argument("--wgmma", action="store_true", help="also count the warpgroup-MMA gemm's loop (sm_90a)")
    args = parser.parse_args()
    for gemm in args.tiles:
        counts = loop_opcodes(gemm)
        total, mma, fadd = sum(counts.values()), counts["HMMA"], counts["FADD"]
        print(
            f"gemm tile {gemm}: {total} instructions a step, {mma} HMMA, {fadd} FADD ({fadd / total:.0%}), "
            f"{total / mma:.2f} per HMMA; most frequent: {counts.most_common(8)}"
        )
    for swizzle in fragment_gemm.WGMMA_SWIZZLES if args.wgmma else ():
        counts = wgmma_loop_opcodes(swizzle=swizzle)
        whole = wgmma_loop_opcodes(whole_steps=True, swizzle=swizzle)
        total, fadd = sum(counts.values()), counts["FADD"]
        print(
            f"wgmma gemm, swizzle {swizzle}: {total} instructions in the loop with both copy paths, "
            f"{sum(whole.values())} on a step inside K, {counts['HGMMA']} HGMMA, {fadd} FADD "
            f"({whole['FADD'] / sum(whole.values()):.0%} of a step inside K); "
            f"most frequent on a step inside K: {whole.most_common(8)}"
        )


if __name__ == "__main__":
    main()
