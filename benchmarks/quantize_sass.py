"""Instruction counts of the NVFP4 quantise kernel, compiled for the H200 (sm_90) without a GPU.

The kernel is bound by its arithmetic (benchmarks/quantize_launch_gpu.py), so the SASS instructions a
thread issues per element of the quantise loop are the figure to lower. This compiles
``nvfp4_quantize_kernel`` with Triton's bundled ``ptxas`` for a per-token bf16 row of 7168 elements (the
benchmark's activation), disassembles it with the bundled ``nvdisasm`` and prints, per mode, the
registers and the instructions of each loop body divided by the elements a thread handles per pass. The
4/6 loop holds both error forms; the fast form alone is what ordinary rows run (the exact one is for rows
beyond about 2^±100), so ``--fast-only`` compiles a copy of the module whose branch always takes it.

    python -m benchmarks.quantize_sass [--dtype bf16|fp16|fp32] [--launch 1024 2] [--fast-only] [--maxnreg 72]

``--maxnreg`` caps the registers as Triton's launch option of that name would (what does not fit is spilled:
``STACK`` in the resource line, the loop's ``STL``/``LDL`` counts after its opcodes).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from nibble.kernels.gpu import nvfp4 as gpu_nvfp4
from nibble.kernels.gpu import nvfp4_quantize

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
K = 7168


def kernel_module(fast_only: bool):
    """The quantise module, or a copy (in a temporary package) whose 4/6 branch always takes the fast form."""
    if not fast_only:
        return nvfp4_quantize
    src = Path(nvfp4_quantize.__file__)
    package = Path(tempfile.mkdtemp()) / "fastonly"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nvfp4_four_over_six.py").write_text((src.parent / "nvfp4_four_over_six.py").read_text())
    text = src.read_text()
    if "        if fast:\n" not in text:
        raise SystemExit("the 4/6 branch 'if fast:' is not in nvfp4_quantize.py any more: update this script")
    (package / "nvfp4_quantize.py").write_text(text.replace("        if fast:\n", "        if True:\n"))
    sys.path.insert(0, str(package.parent))
    spec = importlib.util.spec_from_file_location("fastonly.nvfp4_quantize", package / "nvfp4_quantize.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_sass(
    module, dtype: str, four_over_six: bool, chunk_elements: int, warps: int, maxnreg: int | None = None
) -> tuple[str, str]:
    """(SASS text, resource line) of the per-token kernel for rows of ``K`` elements, registers capped at
    ``maxnreg`` if given."""
    kernel = module.nvfp4_quantize_kernel
    kb = K // 16
    block_m, chunk = gpu_nvfp4._tile(kb, chunk_elements)
    consts = dict(
        E=256.0 if four_over_six else 448.0, PER_TOKEN=True, AMAX_IN_KERNEL=True, FOUR_OVER_SIX=four_over_six,
        MSE=True, WRITE_CHOICE=False, WRITE_OPERAND=False, BLOCK_M=block_m, CHUNK=chunk,
        NUM_CHUNKS=triton.cdiv(kb, chunk), ROW_CHUNKS=triton.cdiv(kb, chunk), UNROLL_AMAX=False,
    )  # fmt: skip
    args = ["x_ptr", "amax_ptr", "codes_ptr", "scales_ptr", "g_ptr", "choice_ptr", "operand_ptr"]
    args += ["M", "KB", "stride_xm"]
    types = [f"*{dtype}", "*fp32", "*i32", "*u8", "*fp32", "*u8", "*fp16", "i32", "i32", "i32"]
    signature = dict(zip(args, types, strict=True)) | {name: "constexpr" for name in consts}
    # what the launcher's specialisation gives for aligned tensors and multiples of 16
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in args}
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(n),): v for n, v in consts.items()},
        attrs=attrs,
    )
    options = {"num_warps": warps, "enable_fp_fusion": False} | ({"maxnreg": maxnreg} if maxnreg else {})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([BIN / "nvdisasm", "-c", cubin.name], capture_output=True, text=True, check=True)
        usage = subprocess.run([BIN / "cuobjdump", "--dump-resource-usage", cubin.name], capture_output=True, text=True)
    return sass.stdout, usage.stdout.strip().splitlines()[-1].strip()


def loops(sass: str) -> list[tuple[int, collections.Counter]]:
    """(instruction count, opcode counter) of each loop body: from a label to a branch back to it."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        label = re.match(r"^\s*\.(L\w+):", line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        op = re.match(r"\s*/\*[0-9a-f]+\*/\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)", line)
        if op:
            instructions.append((op.group(1).split(".")[0], op.group(2)))
    found = []
    for i, (op, rest) in enumerate(instructions):
        target = re.search(r"`\(\.(L\w+)\)", rest) if op == "BRA" else None
        if target and labels.get(target.group(1), i) < i:
            body = instructions[labels[target.group(1)] : i + 1]
            found.append((len(body), collections.Counter(o for o, _ in body)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--launch", type=int, nargs=2, default=None, metavar=("CHUNK_ELEMENTS", "WARPS"))
    parser.add_argument("--fast-only", action="store_true")
    parser.add_argument("--maxnreg", type=int, default=None, help="cap the registers per thread")
    args = parser.parse_args()
    module = kernel_module(args.fast_only)
    for four_over_six in (False, True):
        chunk_elements, warps = args.launch or gpu_nvfp4.LAUNCH[four_over_six]
        sass, usage = compile_sass(module, args.dtype, four_over_six, chunk_elements, warps, args.maxnreg)
        block_m, chunk = gpu_nvfp4._tile(K // 16, chunk_elements)
        per_thread = block_m * chunk * 16 / (32 * warps)
        print(f"{'four_over_six' if four_over_six else 'standard'} {args.dtype} ({chunk_elements}, {warps}): {usage}")
        for count, ops in loops(sass):
            top = ", ".join(f"{o} {n}" for o, n in ops.most_common(8))
            spills = f"; spills: STL {ops['STL']}, LDL {ops['LDL']}" if ops["STL"] or ops["LDL"] else ""
            print(f"  loop of {count} instructions: {count / per_thread:.1f} per element  [{top}]{spills}")


if __name__ == "__main__":
    main()
