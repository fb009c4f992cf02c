"""qweight compute-order packing and s2 interleave (docs/design.md §4)."""

import pytest
import torch

from qoq.export.packing import (
    deinterleave_s2,
    interleave_s2,
    pack_qweight,
    pack_qweight_closed_form,
    unpack_qweight,
)


def random_codes(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n,k", [(32, 32), (64, 96), (96, 64)])
def test_closed_form_equals_reshape_form(n, k):
    q = random_codes(n, k)
    packed = pack_qweight(q)
    assert packed.dtype == torch.int8 and packed.shape == (n, k // 2)
    assert torch.equal(packed, pack_qweight_closed_form(q))


@pytest.mark.parametrize("n,k", [(32, 64), (128, 96)])
def test_pack_unpack_round_trip(n, k):
    q = random_codes(n, k, seed=1)
    assert torch.equal(unpack_qweight(pack_qweight(q), n, k), q)


def test_one_byte_by_hand():
    # n0=1, b=1, c=3 (low row 32+8+3=43, high row 59); k0=2, d=1, e=2, f=1 (column 64+16+8+1=89)
    q = torch.zeros(64, 96, dtype=torch.uint8)
    q[43, 89], q[59, 89] = 9, 5
    flat = pack_qweight(q).view(torch.uint8).flatten()
    byte = (1 * 3 + 2) * 512 + (4 * 3 + 2) * 16 + 8 * 1 + 4 * 1 + 1  # = 2797
    assert flat[byte].item() == 9 | (5 << 4)
    assert flat.count_nonzero().item() == 1


def test_interleave_round_trip_and_positions():
    x = torch.arange(64 * 3, dtype=torch.int16).reshape(64, 3)  # logical [N, K/g]
    stored = interleave_s2(x)
    assert stored.shape == (3, 64)
    for n0, c, j in [(0, 0, 0), (1, 3, 2), (1, 7, 3), (0, 5, 1)]:
        assert stored[2, 32 * n0 + 4 * c + j] == x[32 * n0 + 8 * j + c, 2]
    assert torch.equal(deinterleave_s2(stored), x)


def test_bad_shapes_and_codes_raise():
    with pytest.raises(ValueError, match=r"N=48, K=64"):
        pack_qweight(random_codes(48, 64))
    with pytest.raises(ValueError, match=r"N=32, K=40"):
        pack_qweight_closed_form(random_codes(32, 40))
    with pytest.raises(ValueError, match="0..15, found 16"):
        pack_qweight(torch.full((32, 32), 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\[32, 16\]"):
        unpack_qweight(torch.zeros(32, 32, dtype=torch.int8), 32, 32)
    with pytest.raises(ValueError, match="N=40"):
        interleave_s2(torch.zeros(40, 2))
