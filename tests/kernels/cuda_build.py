"""Compile the CUDA fragment kernels (``kernels/gpu/fragment_gemm.cu``) for a GPU architecture on a machine
without a GPU.

On a GPU machine the kernels are compiled by NVRTC at their first launch (through ``torch.cuda``), so a
source the compiler rejects would pass every CPU test and fail there. NVRTC itself runs without a GPU: this
module loads it from the ``nvidia-cuda-nvrtc-cu12`` wheel (a dev dependency) and compiles to a cubin for the
architecture asked for, with ptxas's report of each kernel's registers and spills.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path


class BuildError(RuntimeError):
    """NVRTC rejected the source; the message holds its log."""


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    from nvidia import cuda_nvrtc  # the nvidia-cuda-nvrtc-cu12 wheel's namespace package

    (lib,) = Path(next(iter(cuda_nvrtc.__path__)), "lib").glob("libnvrtc.so.*[0-9]")
    return ctypes.CDLL(str(lib))


def compile_cubin(source: str, options: tuple[str, ...], arch: int | str) -> tuple[bytes, str]:
    """``source`` compiled by NVRTC to a cubin for ``sm_<arch>`` (``"90a"`` for Hopper's ``wgmma``), and NVRTC's
    log (ptxas's report: registers, stack and spill bytes per kernel). Raises :class:`BuildError` with the log where
    NVRTC rejects it."""
    lib = _nvrtc()
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"fragment_gemm.cu", 0, None, None):
        raise BuildError("nvrtcCreateProgram failed")
    try:
        flags = [f"--gpu-architecture=sm_{arch}".encode(), b"--ptxas-options=-v", *(o.encode() for o in options)]
        status = lib.nvrtcCompileProgram(program, len(flags), (ctypes.c_char_p * len(flags))(*flags))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        if status:
            raise BuildError(log.value.decode(errors="replace"))
        lib.nvrtcGetCUBINSize(program, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(program, cubin)
        return cubin.raw, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
