"""Every Triton kernel, in the forms its launcher picks, builds for Hopper (sm_90) — checked without a GPU.

The interpreter tests check the kernels' arithmetic; they cannot see code the compiler rejects (a loop
variable reused with another type passed every CPU test and failed at the quantiser's first GPU launch).
This test runs each launcher on small inputs under the interpreter, recording the launches, and builds
every recorded specialisation to a cubin with Triton's compiler (``tests.kernels.hopper_build``). The
CUDA-only launch choices (the GEMM's float16 dot and wider column tile, 16-bit quantiser inputs) are built
by the GPU tests on the H200.
"""

import ast
import os
from pathlib import Path

import pytest
import torch

from nibble.kernels import nvfp4
from tests.helpers import expert_routing, heavy_tailed
from tests.kernels.hopper_build import compile_for_hopper, record_launches

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import (
    attention,
    dense_gemm,
    expert_combine,
    expert_order,
    expert_tiles,
    fragment_layout,
    rms_norm,
)
from nibble.kernels.gpu import gemm as gpu_gemm
from nibble.kernels.gpu import nvfp4 as gpu_nvfp4

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="records interpreted launches; a GPU machine compiles its own"
)
GPU_SOURCES = Path(gpu_nvfp4.__file__).parent
SMALL_CHUNKS = (256, 2)  # 16 blocks a chunk: rows of a few chunks stay small for the interpreter


def _quantizer_forms() -> None:
    x = heavy_tailed((3, 96), 1)
    for fos in (None, "mse", "mae"):
        for per_token in (True, False):
            gpu_nvfp4.quantize(x, per_token=per_token, four_over_six=fos, with_choices=fos == "mse")
    long_row = heavy_tailed((2, 2560), 2)  # 10 chunks of 16 blocks
    for fos in (None, "mse"):
        for split in (2, 5):  # 5 chunks a program: the amax pass loops; 2: it is unrolled (<= 8 chunks)
            gpu_nvfp4.quantize(long_row, per_token=True, four_over_six=fos, launch=SMALL_CHUNKS, split=split)
        gpu_nvfp4.quantize(long_row[:, :1024], per_token=True, four_over_six=fos, launch=SMALL_CHUNKS, split=2)
        gpu_nvfp4.quantize(long_row, per_token=True, four_over_six=fos, operand=True)
    wide = heavy_tailed((1, 16 * 4097), 3)  # past the blocks a program reduces: the amax comes from torch
    gpu_nvfp4.quantize(wide, per_token=True, four_over_six=None)


def _gemm_forms() -> None:
    qx = nvfp4.quantize(heavy_tailed((5, 96), 4), scale="per_token", four_over_six="mse", backend="triton")
    with_operand = nvfp4.quantize(heavy_tailed((5, 96), 4), scale="per_token", backend="triton", gemm_operand=True)
    qw = nvfp4.quantize(heavy_tailed((40, 96), 5).to(torch.bfloat16), scale="per_tensor", backend="triton")
    for out_dtype in (torch.float32, torch.bfloat16):
        gpu_gemm.packed_matmul(qx, qw, out_dtype)
        gpu_gemm.packed_matmul(with_operand, qw, out_dtype)
    gpu_nvfp4.dequantize(qx, torch.float32)
    gpu_nvfp4.dequantize(qw, torch.bfloat16)
    stack = nvfp4.quantize(heavy_tailed((3, 40, 96), 6).reshape(3, -1), scale="per_token", backend="triton")
    stack = stack.__class__(
        stack.codes.reshape(3, 40, 48), stack.block_scales.reshape(3, 40, 6), stack.global_scale, False, (3, 40, 96)
    )
    experts = torch.tensor([0, 0, 2, 2, 2])
    gpu_gemm.packed_grouped_matmul(qx, stack, experts, None, torch.float32)
    gpu_gemm.packed_grouped_matmul(qx, stack, experts, torch.tensor([4, 0, 1, 3, 2]), torch.bfloat16)
    fragment_layout.fragment_words(torch.randint(0, 256, (2, 32, 64), dtype=torch.uint8))


def _model_forms() -> None:
    x = heavy_tailed((3, 64), 7).to(torch.bfloat16)
    w = heavy_tailed((40, 64), 8).to(torch.bfloat16)
    dense_gemm.matmul(x, w)
    dense_gemm.matmul(x, w, torch.ones(40, dtype=torch.bfloat16), out_dtype=torch.float32)
    rms_norm.rms_norm(x, torch.ones(64), 1e-6)
    angles = torch.rand(3, 32)
    rms_norm.rms_norm(x.reshape(3, 2, 32), torch.ones(32), 1e-6, rope=(angles.cos(), angles.sin()))
    q = heavy_tailed((1, 4, 3, 32), 9).to(torch.bfloat16)
    k = heavy_tailed((1, 2, 5, 32), 10).to(torch.bfloat16)
    key_mask = torch.ones(1, 5, dtype=torch.bool)
    attention.attention(q, k, k, key_mask, torch.zeros(1, dtype=torch.long), torch.full((1,), 2, dtype=torch.long))
    weighted, top_k_index, order = expert_routing(4, 2, 4, 32, torch.bfloat16, 11)
    expert_combine.expert_combine(weighted, top_k_index, order)
    expert_order.expert_order(top_k_index)
    expert_tiles.expert_tiles(top_k_index.reshape(-1).sort().values, 4, 4)


def _launched_kernels() -> set[str]:
    """The names of the kernels the launchers in ``nibble.kernels.gpu`` launch (``name[grid](...)``)."""
    names = set()
    for source in GPU_SOURCES.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
            if call and isinstance(node.func.value, ast.Name):
                names.add(node.func.value.id)
    return names


def test_every_launched_kernel_builds_for_hopper():
    with record_launches() as launches:
        _quantizer_forms()
        _gemm_forms()
        _model_forms()
    recorded = {launch.name for launch in launches}
    assert _launched_kernels() <= recorded, f"launchers not exercised here: {_launched_kernels() - recorded}"
    failures = compile_for_hopper(launches)
    assert not failures, "\n\n".join(f"{what}:\n{error}" for what, error in failures.items())


def test_a_kernel_the_compiler_rejects_is_reported():
    """The check itself: a kernel that the interpreter runs but the compiler rejects is named as a failure."""
    with record_launches() as launches:
        gpu_nvfp4.quantize(heavy_tailed((2, 64), 12), per_token=True, four_over_six=None)
    launch = launches[0]
    bad = launch.__class__(
        "tests.kernels.hopper_build_faulty", "faulty_kernel", (("x_ptr", "*fp32"), ("N", "constexpr")), (("N", 4),), ()
    )
    failures = compile_for_hopper([launch, bad])
    assert list(failures) == [bad.describe()]
    assert "changed type" in failures[bad.describe()]
