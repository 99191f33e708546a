"""benchmarks/gemm_sass.py reads gemm's main loop out of the sm_90 SASS: one step of 128 elements of K holds a
tensor-core instruction per block, n8 tile and column group, and a float32 add per block and output."""

import pytest

pytest.importorskip("nvidia.cuda_nvrtc", reason="the nvidia-cuda-nvrtc-cu12 dev dependency is not installed")
pytest.importorskip("triton", reason="the triton package (its nvdisasm) is not installed")

from benchmarks.gemm_sass import loop_opcodes, wgmma_loop_opcodes, without_general_copies
from nibble.kernels.gpu import fragment_gemm


@pytest.mark.parametrize("groups,warps", [(1, 8), (2, 8), (1, 4)])
def test_the_loop_of_a_step_is_found_by_its_instructions(groups, warps):
    counts = loop_opcodes((groups, 2, warps))
    blocks, tiles = 8, 8
    assert counts["HMMA"] == blocks * tiles * groups
    assert counts["FADD"] >= blocks * tiles * groups * 4  # 4 outputs a lane per mma; the chunk-end adds on top
    assert counts["BAR"] == 1


@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
def test_the_wgmma_loop_holds_a_warpgroup_mma_and_the_adds_of_each_block(swizzle):
    counts = wgmma_loop_opcodes(swizzle=swizzle)
    blocks, outputs_per_thread = 8, 64  # a 64 x 128 block product over a warpgroup's 128 threads
    assert counts["HGMMA"] == blocks
    assert counts["FADD"] >= blocks * outputs_per_thread
    assert counts["HMMA"] == 0 and counts["BAR"] == 1


@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
def test_a_step_inside_k_takes_the_whole_step_copies_only(swizzle):
    """The whole-step path: the step's 8 activation copies, 2 weight copies and the scales' copy, no more (the
    general copies, which the last step of a ragged K takes, are left out) and the same products and adds."""
    every = wgmma_loop_opcodes(swizzle=swizzle)
    whole = wgmma_loop_opcodes(whole_steps=True, swizzle=swizzle)
    assert whole["LDGSTS"] == 8 + 2 + 1 and every["LDGSTS"] == 2 * whole["LDGSTS"]
    assert whole["HGMMA"] == every["HGMMA"] and whole["FADD"] == every["FADD"]


def test_a_loop_without_a_branch_over_general_copies_is_refused():
    loop = [
        "        /*0000*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
        "        /*0010*/                   FADD R1, R1, R2 ;",
    ]
    with pytest.raises(ValueError, match="no branch over general copies"):
        without_general_copies(loop)


def test_a_shorter_span_is_not_taken_for_the_general_copies():
    """Paths laid out the other way round (the span the branch jumps to is the shorter) are refused, not counted."""

    def line(address: int, text: str) -> str:
        return f"        /*{address:04x}*/                   {text} ;"

    loop = [
        line(0, "BAR.SYNC.DEFER_BLOCKING 0x0"),
        line(16, "@P0 BRA `(.L_x_1)"),
        *(line(32 + 16 * i, "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64], !P1") for i in range(3)),
        line(96, "BRA `(.L_x_2)"),
        ".L_x_1:",
        line(112, "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64], !P1"),
        ".L_x_2:",
        line(128, "FADD R1, R1, R2"),
    ]
    with pytest.raises(ValueError, match="not the longer copy path"):
        without_general_copies(loop)
    loop[7:8] = [line(112 + 16 * i, "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64], P2") for i in range(6)]
    assert len(without_general_copies(loop)) == len(loop) - 7
