"""E2M1/E4M3 element codecs and nibble packing (docs/design.md §2.1)."""

import pytest
import torch
from torchao.prototype.mx_formats.kernels import pack_uint4

from nibble.kernels.codecs import e2m1_decode, e2m1_rne, e4m3_rne, pack_e2m1, unpack_e2m1
from tests.helpers import E2M1_GRID


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)],
)
def test_e2m1_ties_go_to_even_code(value, expected):
    for sign in (1.0, -1.0):
        code = e2m1_rne(torch.tensor([sign * value]))
        assert e2m1_decode(code).item() == sign * expected
        assert int(code) & 1 == 0  # even mantissa bit


def test_e2m1_grid_points_are_exact_and_codes_match_the_spec():
    grid = torch.tensor(E2M1_GRID)
    codes = e2m1_rne(grid)
    assert codes.tolist() == list(range(8))
    assert e2m1_decode(codes).tolist() == list(E2M1_GRID)
    assert (e2m1_rne(-grid[1:]) == torch.arange(9, 16, dtype=torch.uint8)).all()


def test_e2m1_signs_small_negatives_but_not_negative_zero():
    """TE compares the value, not its sign bit: −0.2 codes as −0 (0b1000), an exact −0.0 as +0."""
    codes = e2m1_rne(torch.tensor([-0.0, -0.2, 0.0, 0.2]))
    assert codes.tolist() == [0, 0b1000, 0, 0]
    decoded = e2m1_decode(codes)
    assert torch.signbit(decoded).tolist() == [False, True, False, False]


def test_e2m1_saturates_beyond_six():
    assert e2m1_decode(e2m1_rne(torch.tensor([6.5, 1e30, -7.0]))).tolist() == [6.0, 6.0, -6.0]


def test_e2m1_nearest_matches_brute_force_on_a_dense_sweep():
    x = torch.linspace(-7, 7, 20001)
    grid = torch.tensor(E2M1_GRID)
    candidates = torch.cat([-grid.flip(0), grid])
    dist = (x.clamp(-6, 6).unsqueeze(-1) - candidates).abs()
    nearest = candidates[dist.argmin(-1)]
    decoded = e2m1_decode(e2m1_rne(x))
    is_tie = (dist.sort(-1).values[:, 0] == dist.sort(-1).values[:, 1]) & (x.abs() <= 6)
    assert torch.equal(decoded[~is_tie].abs(), nearest[~is_tie].abs())


def test_pack_layout_low_nibble_is_the_even_element_and_matches_torchao():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert pack_e2m1(codes).tolist() == [[0x21, 0x0F]]
    random_codes = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
    assert torch.equal(pack_e2m1(random_codes), pack_uint4(random_codes))
    assert torch.equal(unpack_e2m1(pack_e2m1(random_codes)), random_codes)


def test_pack_rejects_odd_length_and_wrong_dtype():
    with pytest.raises(ValueError, match="even"):
        pack_e2m1(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        pack_e2m1(torch.zeros(4, dtype=torch.int32))


def test_e4m3_rne_rounds_ties_to_even_and_saturates():
    # Between 1.0 and 1.125 (step 2^-3) the midpoint 1.0625 goes to the even mantissa (1.0);
    # between 1.125 and 1.25 the midpoint 1.1875 goes to 1.25.
    values = torch.tensor([1.0625, 1.1875, 500.0, -1e9, 2.0**-10, 2.0**-9 * 1.5])
    out = e4m3_rne(values).float().tolist()
    assert out == [1.0, 1.25, 448.0, -448.0, 0.0, 2.0**-8]
