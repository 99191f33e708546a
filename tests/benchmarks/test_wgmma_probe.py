"""benchmarks/wgmma_probe_gpu.py off the GPU: its kernel builds for sm_90a, and its operand packing, read back
through the PTX ISA's register layouts (written out here independently), multiplies to ``A @ B.T`` — so a wrong
answer on the GPU would be the hardware's layout, not the probe's packing."""

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed")

from benchmarks import wgmma_probe_gpu as probe


def _a_logical(regs: torch.Tensor) -> torch.Tensor:
    """The 64 x 16 float16 operand that registers ``[128, 4]`` stand for under mma.m16n8k16's A layout per warp."""
    a = torch.empty(64, 16, dtype=torch.float16)
    for t in range(128):
        row, col = 16 * (t // 32) + (t % 32) // 4, 2 * (t % 4)
        for reg, (dr, dc) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
            word = int(regs[t, reg]) & 0xFFFFFFFF
            halves = torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16)
            a[row + dr, col + dc : col + dc + 2] = halves.view(torch.float16)
    return a


def _d_registers(d: torch.Tensor) -> torch.Tensor:
    """A 64 x N result as the threads' registers: thread t's register 4i + 2h + e is row 16 (t // 32) + (t % 32)
    // 4 + 8h, column 8i + 2 (t % 4) + e."""
    regs = torch.empty(128, probe.N // 2)
    for t in range(128):
        for i in range(probe.N // 8):
            for h in range(2):
                for e in range(2):
                    regs[t, 4 * i + 2 * h + e] = d[16 * (t // 32) + (t % 32) // 4 + 8 * h, 8 * i + 2 * (t % 4) + e]
    return regs


def test_the_packed_operands_multiply_to_the_product():
    generator = torch.Generator().manual_seed(1)
    a = torch.randint(-4, 5, (64, 16), generator=generator).to(torch.float16)
    b = torch.randint(-4, 5, (probe.N, 16), generator=generator).to(torch.float16)
    assert torch.equal(_a_logical(probe.a_registers(a)), a)
    product = a.float() @ b.float().T
    assert torch.equal(probe.d_matrix(_d_registers(product)), product)


def test_the_kernel_builds_for_hopper_with_wgmma():
    pytest.importorskip("nvidia.cuda_nvrtc", reason="the nvidia-cuda-nvrtc-cu12 dev dependency is not installed")
    from tests.kernels.cuda_build import compile_cubin

    _, log = compile_cubin(probe.source(), (), "90a")
    assert "Compiling entry function 'wgmma_probe' for 'sm_90a'" in log


def test_a_bad_out_is_refused_before_the_gpu_is_looked_for(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["wgmma_probe_gpu", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        probe.main()
    assert exit_info.value.code == 2 and "a directory" in capsys.readouterr().err


def _child(monkeypatch, returncode: int, stdout: str = "", stderr: str = "") -> dict:
    """gemm_layout with the child process's answer given (no GPU is touched, on any machine)."""

    def run(argv, **kwargs):
        assert kwargs["cwd"] == probe.REPOSITORY and "gemm_rows(128)" in argv[-1]
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    monkeypatch.setattr(probe.subprocess, "run", run)
    return probe.gemm_layout(swizzle=128)


def test_a_fault_in_the_gemm_under_one_layout_is_reported_by_its_exception_line(monkeypatch):
    stderr = (
        'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
        "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )
    row = _child(monkeypatch, 1, stderr=stderr)
    assert row == {
        "swizzle": 128,
        "error": "torch.AcceleratorError: CUDA error: an illegal memory access was encountered (exit status 1)",
    }


def test_a_child_that_prints_no_result_is_reported(monkeypatch):
    assert "printed no result" in _child(monkeypatch, 0, stdout="")["error"]
    assert "printed no result" in _child(monkeypatch, 0, stdout="warming up\n")["error"]


def test_the_child_s_rows_become_the_layout_s(monkeypatch):
    shapes = [{"shape": [128, 128, 1024], "wrong_outputs": 0}, {"shape": [300, 272, 2064], "wrong_outputs": 3}]
    row = _child(monkeypatch, 0, stdout="noise\n" + json.dumps(shapes) + "\n")
    assert row == {"swizzle": 128, "same_bits": False, "shapes": shapes}
