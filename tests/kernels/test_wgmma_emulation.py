"""The warpgroup-MMA gemm (``nvfp4_fragment_wgmma``) emulated on the CPU, byte for byte: its staging into shared
memory, its descriptor, the register layouts wgmma reads and writes (PTX ISA: A per warp as mma.m16n8k16's A, D
as CUTLASS's CLayout_64xN, B in each K-major layout the kernel can take) and its block-ordered adds, checked
against the CPU reference's bits. The copy's lane mapping, its shared-memory offsets, the descriptor's fields and
each block's descriptor start are read from fragment_gemm.cu's text and evaluated, so an edit there is emulated
here; how the descriptor is read back is modelled independently from the PTX ISA's canonical layouts. Whether
the hardware reads them so is benchmarks/wgmma_probe_gpu.py's question, and the GPU bit test's."""

import itertools
import re

import numpy as np
import pytest
import torch

from nibble.kernels import nvfp4
from nibble.kernels.fragments import REGISTER_BITS, element_order, to_fragments
from nibble.kernels.reference import block_gemm
from tests.helpers import heavy_tailed

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm

ROWS, WARPS, STEP = fragment_gemm.WGMMA_ROWS, 8, 128
X_BYTES = fragment_gemm.wgmma_shared_bytes(1) - WARPS * 1152


def test_the_fragment_k_order_is_the_fragment_layouts():
    # lane c, register r, half e holds element 4c + 2(r // 2) + e, which mma numbers 2c + 8(r // 2) + e
    _, element = element_order()
    for lane in range(32):
        for register in range(4):
            for half in range(2):
                logical = 2 * (lane % 4) + 8 * (register // 2) + half
                assert fragment_gemm.FRAGMENT_K_ORDER[logical] == element[lane, register, half]


def _halves(words: np.ndarray) -> np.ndarray:
    """uint32 words as float64 pairs (low half first)."""
    return words.astype(np.uint32).view(np.float16).reshape(*words.shape, 2).astype(np.float64)


def _weight_operands(words: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """A warp's decoded, scaled operand of each of a quad's four blocks, float64 ``[4 blocks, 16 rows, 16 slots]``
    (slots in mma's logical K order), from its 32 lanes' words ``[32, 4]`` and scale pairs ``[8, 2]``: what
    fragment_gemm.cu's decode and scale_operands compute, read through the fragment layout's definition."""
    row, element = element_order()
    codes = torch.zeros(4, 16, 16, dtype=torch.int64)
    bits = torch.from_numpy(words.astype(np.int64))
    for j in range(4):  # a lane's word j holds block j's 8 codes: registers 0..3, halves 0..1, per REGISTER_BITS
        for lane in range(32):
            for register in range(4):
                for half in range(2):
                    code = _code(int(bits[lane, j]), register, half)
                    codes[j, row[lane, register, half], element[lane, register, half]] = code
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    magnitude = values[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    scale_bytes = torch.from_numpy(scales.astype(np.uint32).view(np.uint8).reshape(8, 8).copy())
    block_scales = torch.empty(4, 16, dtype=torch.float64)
    for j in range(4):  # pair p of the quad: rows p and p + 8, byte 2j and 2j + 1
        for p in range(8):
            block_scales[j, p] = scale_bytes[p, 2 * j].view(torch.float8_e4m3fn).to(torch.float64)
            block_scales[j, p + 8] = scale_bytes[p, 2 * j + 1].view(torch.float8_e4m3fn).to(torch.float64)
    operand = magnitude * 2.0**-14 * block_scales[:, :, None]
    return operand[:, :, list(fragment_gemm.FRAGMENT_K_ORDER)].numpy()


def _code(word: int, register: int, half: int) -> int:
    magnitude_bits = REGISTER_BITS[register][0 if half == 0 else 2]
    sign_bit = REGISTER_BITS[register][1 if half == 0 else 3]
    magnitude = sum(((word >> bit) & 1) << i for i, bit in enumerate(magnitude_bits))
    return magnitude | (((word >> sign_bit) & 1) << 3)


def _python(expression: str) -> str:
    """A C integer expression of fragment_gemm.cu in Python: its operands are non-negative, so ``/`` is ``//``;
    ``ull`` suffixes dropped (C and Python rank ``* / % + - << >> & ^`` alike)."""
    return re.sub(r"(\d+)ull\b", r"\1", expression).replace("/", "//")


def _swizzle_branches(marker: str) -> dict[int, list[str]]:
    """The lines of each branch of the ``#if WG_SWIZZLE == 0`` chain in fragment_gemm.cu that starts at the line
    ``marker`` follows (an ``#else`` is the swizzle no earlier branch named, if one is left)."""
    lines = fragment_gemm.SOURCE.read_text().split(marker, 1)[1].splitlines()
    start = 0
    while not lines[start].startswith("#if WG_SWIZZLE == 0"):
        start += 1
    branches, current = {}, None
    for line in lines[start:]:
        if match := re.match(r"#(?:el)?if WG_SWIZZLE == (\d+)", line):
            current = int(match[1])
            branches[current] = []
        elif line.startswith("#else"):
            current = next((s for s in fragment_gemm.WGMMA_SWIZZLES if s not in branches), "#else")
            branches[current] = []
        elif line.startswith("#endif"):
            return {s: body for s, body in branches.items() if s != "#else"}
        else:
            branches[current].append(line.split("//")[0].strip())
    raise AssertionError(f"no #endif after {marker!r}")


def _kernel(swizzle: int) -> dict:
    """fragment_gemm.cu's index math for ``swizzle``, read from its text and evaluated: the copy's lane mapping,
    ``wg_x_offset``, the descriptor macros and ``wg_block_start`` (so that this emulation follows the kernel)."""
    (lanes,) = [line for line in _swizzle_branches("static_assert(WG_TOKENS == 16 * WG_WARPS")[swizzle] if line]
    row, half = re.fullmatch(r"const int xrow = (.*), xhalf = (.*);", lanes).groups()
    (offset,) = [line for line in _swizzle_branches("wg_x_offset(int block, int row, int half) {")[swizzle] if line]
    macros = dict(
        re.fullmatch(r"#define (\w+) (.*)", line).groups()
        for line in _swizzle_branches("#define WG_STAGE_BYTES")[swizzle]
        if line
    )
    text = fragment_gemm.SOURCE.read_text()
    condition, chosen, other = re.search(
        r"wg_block_start\(int block\) \{\s*return (.*?) \? (.*?) : (.*?);", text, re.S
    ).groups()
    names = {"WG_TOKENS": ROWS, "WG_SWIZZLE": swizzle}
    fields = {name: eval(_python(value), {}, names) for name, value in macros.items()}
    return {
        "lane": lambda warp, lane: tuple(eval(_python(e), {}, {"warp": warp, "lane": lane}) for e in (row, half)),
        "offset": lambda block, row, half: eval(
            _python(offset.removeprefix("return ").removesuffix(";")),
            {},
            names | {"block": block, "row": row, "half": half},
        ),
        "descriptor": (fields["WG_LEADING"] << 16) | (fields["WG_STRIDE"] << 32) | (fields["WG_LAYOUT"] << 62),
        "block_start": lambda block: eval(
            _python(f"({chosen}) if ({condition}) else ({other})"), {}, names | {"block": block}
        ),
    }


def _b_addresses(descriptor: int) -> np.ndarray:
    """Where wgmma reads B's element ``[n, k]`` (int64 ``[128, 16]``, shared bytes) for a K-major ``descriptor``,
    decoded as the PTX ISA lays the matrix descriptor out (start address, leading and stride byte offsets >> 4 in
    bits 0-13, 16-29, 32-45; swizzle mode in bits 62-63: 0 none, 1 128 bytes, 2 64, 3 32) and reads its canonical
    layouts, as CUTLASS's make_gmma_desc writes them in 16-byte units: without swizzle ``((8, n), 2) : ((1, SBO),
    LBO)``; with a T-byte swizzle ``Swizzle<log2(T / 16), 4, 3> o ((8, n), 2) : ((T / 16, SBO), 1)``, XOR-ing the
    address's 16-byte chunk bits with the bits from 7 up."""
    start, leading, stride = ((descriptor >> shift & 0x3FFF) << 4 for shift in (0, 16, 32))
    swizzle = {0: 0, 1: 128, 2: 64, 3: 32}[descriptor >> 62 & 3]
    nn, kk = np.arange(ROWS)[:, None], np.arange(16)[None, :]
    if not swizzle:
        return start + (nn // 8) * stride + (nn % 8) * 16 + (kk // 8) * leading + (kk % 8) * 2
    plain = start + (nn // 8) * stride + (nn % 8) * swizzle + (kk // 8) * 16 + (kk % 8) * 2
    return plain ^ (((plain >> 7) & (swizzle // 16 - 1)) << 4)


def _emulate(qx, qw, k_order=fragment_gemm.FRAGMENT_K_ORDER, swizzle: int = 0, kernel=None) -> torch.Tensor:
    kernel = kernel or _kernel(swizzle)
    m, k = qx.shape
    n = qw.shape[0]
    x, xg = gpu_gemm._activations(qx)
    x = x.to(torch.float16).view(m, k // 16, 16)[:, :, list(k_order)].reshape(m, k).numpy()
    xg = xg.numpy()
    wg = np.float32(qw.global_scale.to(torch.float32).item())
    frag = to_fragments(qw.codes, qw.block_scales)
    words = frag.words[0].numpy().view(np.uint32)  # [G, Q, 32, 4]
    scales = frag.scales[0].numpy().view(np.uint32).reshape(*frag.scales.shape[1:3], 8, 2)  # [G, Q, 8 pairs, 2]
    groups, quads = words.shape[:2]
    out = np.full((m, n), np.nan, dtype=np.float32)
    steps = (quads + 1) // 2
    decoded = {}  # (group, quad): its four blocks' operands
    for bx in range(-(-m // ROWS)):
        for by in range(-(-groups // WARPS)):
            acc = np.zeros((WARPS, 16, ROWS), np.float32)
            total = np.zeros_like(acc)
            for step in range(steps):
                stage = np.zeros(X_BYTES, np.uint8)
                for warp in range(WARPS):  # the kernel's activation copies, lane by lane
                    for lane in range(32):
                        row, half = kernel["lane"](warp, lane)
                        for block in range(8):
                            element = step * STEP + block * 16 + half * 8
                            if bx * ROWS + row < m and element < k:
                                dst = kernel["offset"](block, row, half)
                                stage[dst : dst + 16] = x[bx * ROWS + row, element : element + 8].view(np.uint8)
                for block in range(8):  # B through the descriptor (the stage at shared address 0)
                    at = _b_addresses(kernel["descriptor"] + kernel["block_start"](block))
                    if at.min() < 0 or at.max() + 2 > X_BYTES:
                        raise IndexError(f"block {block}: wgmma would read B outside the stage's activations")
                    b = stage.view(np.uint8)[at[..., None] + np.arange(2)].copy().view(np.float16)[..., 0]
                    quad, j = 2 * step + block // 4, block % 4
                    for warp in range(WARPS):
                        g = by * WARPS + warp
                        if g < groups and quad < quads:
                            if (g, quad) not in decoded:
                                decoded[g, quad] = _weight_operands(words[g, quad], scales[g, quad])
                            a = decoded[g, quad][j]
                        else:
                            a = np.zeros((16, 16))
                        d = a @ b.astype(np.float64).T  # exact: each block's sum spans at most 20 bits
                        assert np.array_equal(d.astype(np.float32), d)
                        acc[warp] = acc[warp] + d.astype(np.float32)
                if (2 * step + 2) % fragment_gemm.CHUNK_QUADS == 0 or step == steps - 1:
                    total, acc = total + acc, np.zeros_like(acc)
            for warp in range(WARPS):
                g = by * WARPS + warp
                for r in range(16):
                    for t in range(ROWS):
                        row, col = bx * ROWS + t, g * 16 + r
                        if row < m and col < n:
                            v = np.float32(total[warp, r, t] * np.float32(16384.0))
                            out[row, col] = np.float32(np.float32(v * xg[row]) * wg)
    return torch.from_numpy(out)


def _operands(m: int, n: int, k: int, seed: int):
    qx = nvfp4.quantize(heavy_tailed((m, k), seed), scale="per_token", four_over_six="mse")
    qw = nvfp4.quantize(heavy_tailed((n, k), seed + 1).to(torch.bfloat16), scale="per_tensor", four_over_six="mse")
    return qx, qw


@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
@pytest.mark.parametrize("m,n,k", [(3, 40, 96), (130, 24, 2112), (2, 136, 1040)])
def test_the_emulated_kernel_gives_the_reference_bits(m, n, k, swizzle):
    """Rows past the 128-row tile, column groups past the weight's and a second column CTA, K ending inside a
    quad and a step, five chunks; under every shared-memory layout."""
    qx, qw = _operands(m, n, k, seed=m + n)
    expected = block_gemm.matmul(qx, qw, torch.float32)
    assert torch.equal(_emulate(qx, qw, swizzle=swizzle).view(torch.int32), expected.view(torch.int32))


def test_the_emulation_fails_when_the_activations_keep_their_natural_order():
    qx, qw = _operands(3, 40, 96, seed=7)
    assert not torch.equal(_emulate(qx, qw, tuple(range(16))), block_gemm.matmul(qx, qw, torch.float32))


@pytest.mark.parametrize("swizzle", fragment_gemm.WGMMA_SWIZZLES)
def test_each_quarter_warp_copy_reads_whole_sectors_or_writes_without_bank_conflicts(swizzle):
    """Per copy instruction (one block, a warp's 32 lanes), each group of 8 lanes — the unit in which shared memory
    takes 16-byte stores — covers 8 different 16-byte bank groups; with a swizzle, also whole 32-byte sectors of
    the activations: 4 rows, each with both halves (ncu counted the unswizzled copy's sectors twice)."""
    kernel = _kernel(swizzle)
    for warp, block, quarter in itertools.product(range(8), range(8), range(4)):
        lanes = [kernel["lane"](warp, 8 * quarter + i) for i in range(8)]
        banks = {(kernel["offset"](block, row, half) % 128) // 16 for row, half in lanes}
        assert len(banks) == 8, (warp, block, quarter)
        if swizzle:
            rows = {row for row, _ in lanes}
            assert len(rows) == 4 and sorted(lanes) == sorted((row, half) for row in rows for half in (0, 1))


@pytest.mark.parametrize(
    "swizzle, change",
    [
        (32, ("offset", lambda e: e.replace(" ^ ((row >> 2) & 1)", ""))),  # the copy forgets the swizzle
        (128, ("offset", lambda e: e.replace(" ^ (row & 7)", ""))),
        (32, ("WG_LAYOUT", lambda e: "2")),  # the descriptor names the 64-byte swizzle
        (128, ("WG_STRIDE", lambda e: "(256 >> 4)")),
    ],
)
def test_the_emulation_fails_when_the_copy_and_the_descriptor_disagree(swizzle, change, monkeypatch, tmp_path):
    """Rows 4-7 of each 8 are where the 32-byte swizzle moves anything, so the product has more than 8 rows."""
    name, edit = change
    text = fragment_gemm.SOURCE.read_text()
    if name == "offset":
        body = _swizzle_branches("wg_x_offset(int block, int row, int half) {")[swizzle]
        (line,) = [b for b in body if b]
        edited = text.replace(line, edit(line), 1)
    else:
        (line,) = [b for b in _swizzle_branches("#define WG_STAGE_BYTES")[swizzle] if b.startswith(f"#define {name} ")]
        edited = text.replace(line, f"#define {name} {edit(line)}", 1)
    assert edited != text
    (tmp_path / "fragment_gemm.cu").write_text(edited)
    monkeypatch.setattr(fragment_gemm, "SOURCE", tmp_path / "fragment_gemm.cu")
    qx, qw = _operands(9, 40, 96, seed=7)
    try:
        got = _emulate(qx, qw, swizzle=swizzle)
    except IndexError:  # a disagreement too: B read past the activations
        return
    assert not torch.equal(got, block_gemm.matmul(qx, qw, torch.float32))
