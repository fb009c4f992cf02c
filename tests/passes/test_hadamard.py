import math
import warnings

import pytest
import torch

from qoq.quant.hadamard import (hadamard, hadamard_rotation, hadamard_plan, integer_hadamard, paley1, paley2, prime_power,
                                 random_orthogonal, sylvester)


def _is_hadamard(h: torch.Tensor) -> bool:
    """±1 entries and H·Hᵀ = n·I exactly (fp64 sums of ±1 are exact integers)."""
    n = h.shape[0]
    return bool(((h == 1) | (h == -1)).all()) and torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))


def test_every_constructed_order_up_to_128_is_hadamard():
    missing = []
    for n in range(1, 129):
        found = integer_hadamard(n)
        if found is None:
            missing.append(n)
        else:
            assert _is_hadamard(found[0]), found[1]
    # Hadamard orders are 1, 2 and multiples of 4; Paley I/II with Sylvester reach all of them up to 128
    # except 92 and 116 (those need Williamson-type constructions)
    assert missing == sorted([n for n in range(3, 129) if n % 4] + [92, 116])


@pytest.mark.parametrize("q", [3, 7, 11, 19, 23, 27, 31, 43, 47, 59, 67, 71, 79, 83, 103, 107, 343])
def test_paley1_orders_incl_prime_powers(q):
    assert _is_hadamard(paley1(q))  # 27 = 3^3 and 343 = 7^3 exercise GF(p^e) arithmetic


@pytest.mark.parametrize("q", [5, 9, 13, 17, 25, 29, 37, 41, 49, 53, 61])
def test_paley2_orders_incl_prime_powers(q):
    assert _is_hadamard(paley2(q))


def test_paley_refuses_wrong_residues():
    with pytest.raises(ValueError, match="q ≡ 3 mod 4"):
        paley1(13)
    with pytest.raises(ValueError, match="prime power"):
        paley2(21)
    with pytest.raises(ValueError, match="power of two"):
        sylvester(12)
    assert prime_power(343) == (7, 3) and prime_power(2) == (2, 1) and prime_power(12) is None


@pytest.mark.parametrize("n, kind", [
    (576, "hadamard-table(36)xsylvester(16)"),
    (640, "hadamard-paley1(20)xsylvester(32)"),
    (1536, "hadamard-paley1(12)xsylvester(128)"),
])
def test_k_times_power_of_two_sizes_are_exact(n, kind):
    h, got = hadamard(n)
    assert got == kind
    integer = h * math.sqrt(n)
    assert (integer.round() - integer).abs().max() < 1e-12
    assert _is_hadamard(integer.round())


@pytest.mark.parametrize("n, kind", [(5120, "hadamard-paley1(20)xsylvester(256)"),
                                     (4096, "hadamard-sylvester(4096)")])
def test_large_sizes_are_orthogonal(n, kind):
    h, got = hadamard(n)
    assert got == kind and h.shape == (n, n) and h.dtype == torch.float64
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:64]
    gram = h[rows] @ h.T  # [64, n]: a sample of H·Hᵀ rows, exact enough to see any wrong sign
    expected = torch.zeros(64, n, dtype=torch.float64)
    expected[torch.arange(64), rows] = 1.0
    assert (gram - expected).abs().max() < 1e-12
    assert hadamard_rotation(n)[0] is hadamard_rotation(n)[0]  # cached


def test_11008_uses_the_gf343_paley_core():
    # 11008 = 43·2^8: Paley I over GF(7^3) gives order 344 = 8·43, so 11008 = 344·32 (building the full
    # 11008² matrix is left out of the test for memory; kron of Hadamard matrices is Hadamard)
    assert hadamard_plan(11008) == ("paley1", 344, 32)
    assert _is_hadamard(integer_hadamard(344)[0])
    assert hadamard_plan(172 * 64) == ("paley1", 344, 32) and hadamard_plan(92) is None


def test_fallback_is_seeded_orthogonal_and_warns_every_time():
    for _ in range(2):  # second call hits the cache and must still warn
        with pytest.warns(UserWarning, match="size 92"):
            q, kind = hadamard(92, seed=3)
        assert kind == "random-orthogonal(seed=3)"
    assert (q @ q.T - torch.eye(92, dtype=torch.float64)).abs().max() < 1e-12
    assert torch.equal(q, random_orthogonal(92, 3)) and not torch.equal(q, random_orthogonal(92, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hadamard(576)  # a constructible size never warns


@pytest.mark.parametrize("n", [576, 640, 4096, 92])
def test_factored_rotation_equals_the_dense_matrix(n):
    """x·R and Rᵀ·w applied factor by factor (4096 = 64·64) equal the dense products."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 92: the random fallback, a single dense factor
        rotation, _ = hadamard_rotation(n, seed=1)
    dense = rotation.dense()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 5, n, generator=g), torch.randn(n, 7, generator=g)
    assert (rotation.right(x) - x.double() @ dense).abs().max() < 1e-12
    assert (rotation.left_transposed(w) - dense.T @ w.double()).abs().max() < 1e-12
    if n == 4096:
        assert [f.shape[0] for f in rotation.factors] == [64, 64]


def test_table_core_of_order_36_is_the_reference_implementations():
    """The order-36 core is the table's (QuaRot / deepcompressor), not Paley II(17): a Hadamard matrix whose
    first row is all +1 but its 19th entry, and whose 576 = 36 x 16 rotation is its Kronecker product."""
    from qoq.quant.hadamard import table_core

    core = table_core(36)
    assert _is_hadamard(core) and not torch.equal(core, paley2(17))
    assert core[0].tolist() == [1.0] * 18 + [-1.0] + [1.0] * 17
    h, _ = hadamard(576)
    assert torch.allclose(h * 24, torch.kron(core, sylvester(16).double()), atol=1e-12)
