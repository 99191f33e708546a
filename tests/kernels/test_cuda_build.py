"""The CUDA fragment kernels build for Hopper (sm_90) and Ada (sm_89) for every tile of ``GEMV_TILES`` and
operand form, and every staged tile in the dense forms that take them — checked without a GPU
(``tests.kernels.cuda_build``). The GPU tests check their bits on the H200; this catches, in CI, a source NVRTC
rejects. CI's NVRTC is the wheel's (12.9), the GPU machine's is its torch's (CUDA 13), so a construct only the
newer one rejects would still reach the GPU.
"""

import itertools

import pytest

pytest.importorskip("nvidia.cuda_nvrtc", reason="the nvidia-cuda-nvrtc-cu12 dev dependency is not installed")

from nibble.kernels.gpu import fragment_gemm
from tests.kernels.cuda_build import BuildError, compile_cubin

FORMS = list(itertools.product([False, True], repeat=3))  # grouped, gather, bf16 output
KERNELS = ("nvfp4_fragment_gemv", "nvfp4_fragment_gemm")
BUILDS = [(tile, *form) for tile in fragment_gemm.GEMV_TILES for form in FORMS]
BUILDS += [(tile, False, False, bf16) for tile in fragment_gemm.STAGED_GEMV_TILES for bf16 in (False, True)]
COLUMN_WARP_TILES = ((32, 2, 4, 1, 0, 4), (8, 4, 4, 1, 1, 2))  # warps side by side along N, direct and staged
BUILDS += [(tile, False, False, True) for tile in COLUMN_WARP_TILES]


@pytest.mark.parametrize("tile,grouped,gather,bf16", BUILDS)
def test_every_form_the_launcher_compiles_builds_for_hopper(tile, grouped, gather, bf16):
    cubin, log = compile_cubin(fragment_gemm.source(tile, grouped, gather, bf16), fragment_gemm.NVRTC_OPTIONS, 90)
    for kernel in KERNELS:
        assert f"Compiling entry function '{kernel}' for 'sm_90'" in log
        assert kernel.encode() in cubin


from tests.kernels.test_block_gemm import GEMM_TEST_TILES  # noqa: E402  the GPU tests' tiles

GEMM_BUILDS = [(gemm, *form) for gemm in fragment_gemm.GEMM_TILES for form in FORMS]
GEMM_BUILDS += [(gemm, False, False, True) for gemm in GEMM_TEST_TILES if gemm not in fragment_gemm.GEMM_TILES]


@pytest.mark.parametrize("gemm,grouped,gather,bf16", GEMM_BUILDS)
def test_every_gemm_tile_builds_for_hopper(gemm, grouped, gather, bf16):
    source = fragment_gemm.source(fragment_gemm.GEMV_TILES[0], grouped, gather, bf16, gemm)
    _, log = compile_cubin(source, fragment_gemm.NVRTC_OPTIONS, 90)
    assert "Compiling entry function 'nvfp4_fragment_gemm' for 'sm_90'" in log


def test_a_gemm_tile_of_three_groups_one_stage_or_odd_warps_is_refused():
    for gemm in ((3, 4, 8), (0, 4, 8), (1, 1, 8), (1, 2, 3), (1, 2, 16), (2, 4)):
        with pytest.raises(ValueError, match="two stages"):
            fragment_gemm.source(fragment_gemm.GEMV_TILES[0], False, False, True, gemm)
    source = fragment_gemm.source(fragment_gemm.GEMV_TILES[0], False, False, True, (2, 4, 8))
    with pytest.raises(BuildError, match="at most two column groups"):
        compile_cubin(source.replace("#define GEMM_GROUPS 2", "#define GEMM_GROUPS 3"), fragment_gemm.NVRTC_OPTIONS, 90)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
def test_the_wgmma_gemm_builds_for_hopper_without_spills(bf16, swizzle):
    source = fragment_gemm.wgmma_source(fragment_gemm.WGMMA_STAGES, swizzle, bf16)
    cubin, log = compile_cubin(source, fragment_gemm.NVRTC_OPTIONS, "90a")
    report = log.split("Compiling entry function 'nvfp4_fragment_wgmma' for 'sm_90a'")[1].split("Compiling entry")[0]
    assert "0 bytes spill stores" in report and b"nvfp4_fragment_wgmma" in cubin
    assert fragment_gemm.wgmma_shared_bytes(fragment_gemm.WGMMA_STAGES) <= fragment_gemm.MAX_SHARED_BYTES


def test_the_wgmma_gemm_refuses_a_swizzle_it_has_no_layout_for():
    for swizzle in (64, True, "32"):
        with pytest.raises(ValueError, match=f"swizzle {swizzle!r}, not one of"):
            fragment_gemm.wgmma_source(fragment_gemm.WGMMA_STAGES, swizzle, True)
    for stages, bf16, problem in [(1, True, "1 stages"), ("4", True, "'4' stages"), (4, 1, "bf16 1")]:
        with pytest.raises(ValueError, match=problem):
            fragment_gemm.wgmma_source(stages, 0, bf16)
    with pytest.raises(ValueError, match="swizzle 64"):  # before the operands or a GPU are looked at
        fragment_gemm.launch_wgmma(None, None, None, None, None, swizzle=64)
    source = fragment_gemm.wgmma_source(fragment_gemm.WGMMA_STAGES, 0, True)
    with pytest.raises(BuildError, match="WG_SWIZZLE is 0, 32 or 128"):
        compile_cubin(
            source.replace("#define WG_SWIZZLE 0", "#define WG_SWIZZLE 64"), fragment_gemm.NVRTC_OPTIONS, "90a"
        )


@pytest.mark.parametrize("tile", [fragment_gemm.GEMV_TILES[0], fragment_gemm.STAGED_GEMV_TILES[0]])
def test_builds_for_ada(tile):
    _, log = compile_cubin(fragment_gemm.source(tile, False, False, True), fragment_gemm.NVRTC_OPTIONS, 89)
    assert all(f"Compiling entry function '{kernel}' for 'sm_89'" in log for kernel in KERNELS)


def test_a_source_nvrtc_rejects_is_reported_with_its_log():
    source = fragment_gemm.source(fragment_gemm.GEMV_TILES[0], False, False, True).replace("#define NT", "#define NQ")
    with pytest.raises(BuildError, match='identifier "NT" is undefined'):
        compile_cubin(source, fragment_gemm.NVRTC_OPTIONS, 90)


def test_a_cta_of_more_than_32_warps_is_refused():
    with pytest.raises(ValueError, match="warps x column warps at most 32"):
        fragment_gemm.source((8, 1, 16, 1, 0, 4), False, False, True)


def test_a_staged_tile_of_one_slot_is_refused():
    with pytest.raises(ValueError, match="a staged tile's prefetch at least 2"):
        fragment_gemm.source((8, 1, 8, 1, 1, 1), False, False, True)
    source = fragment_gemm.source((8, 2, 8, 1, 1, 1), False, False, True)
    source = source.replace("#define PREFETCH 2", "#define PREFETCH 1")
    with pytest.raises(BuildError, match="two slots"):
        compile_cubin(source, fragment_gemm.NVRTC_OPTIONS, 90)
