"""Orthogonal rotations for the rotation pass: normalized Hadamard matrices of order k·2^m.

An order-k ±1 core comes from a short table (TABLE_CORES: the reference implementation's matrix where
it differs) or a Paley construction over GF(q) (q a prime power): Paley I gives order q+1 for
q ≡ 3 mod 4, Paley II gives order 2(q+1) for q ≡ 1 mod 4. The core is Kronecker-
multiplied with a Sylvester matrix of order 2^m. Orders with no such construction (92, 116, 172, ...)
fall back to a seeded random orthogonal matrix, with a warning.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import torch

# GF(q) arithmetic, q = p^e: element a in [0, q) is the polynomial whose coefficients are a's base-p digits.


def prime_power(q: int) -> tuple[int, int] | None:
    """(p, e) with q = p^e, p prime, or None."""
    if q < 2:
        return None
    p = next(d for d in range(2, q + 1) if q % d == 0)  # the smallest factor is prime
    e = 0
    while q % p == 0:
        q, e = q // p, e + 1
    return (p, e) if q == 1 else None


def _poly_mod(a: list[int], f: list[int], p: int) -> list[int]:
    """Remainder of a by the monic f over GF(p); coefficients low to high."""
    a, d = a[:], len(f) - 1
    for top in range(len(a) - 1, d - 1, -1):
        c = a[top]
        for i, fi in enumerate(f):
            a[top - d + i] = (a[top - d + i] - c * fi) % p
    return a[:d]


def _monic(p: int, degree: int):
    """Every monic polynomial of the given degree over GF(p), in a fixed order."""
    for code in range(p**degree):
        yield [(code // p**i) % p for i in range(degree)] + [1]


def _irreducible(p: int, e: int) -> list[int]:
    """The first monic degree-e polynomial over GF(p) with no monic factor of degree 1..e/2."""
    return next(f for f in _monic(p, e)
                if all(any(_poly_mod(f, g, p)) for d in range(1, e // 2 + 1) for g in _monic(p, d)))


def _quadratic_character(q: int) -> torch.Tensor:
    """χ(a) for every a in GF(q): 0 at 0, 1 on nonzero squares, -1 otherwise. fp64 [q]."""
    p, e = prime_power(q)
    if e == 1:
        squares = torch.arange(1, q) ** 2 % q
    else:
        f = _irreducible(p, e)
        squares = []
        for a in range(1, q):
            digits = [(a // p**i) % p for i in range(e)]
            product = [0] * (2 * e - 1)
            for i, x in enumerate(digits):
                for j, y in enumerate(digits):
                    product[i + j] += x * y
            squares.append(sum(c * p**i for i, c in enumerate(_poly_mod(product, f, p))))
        squares = torch.tensor(squares)
    chi = -torch.ones(q, dtype=torch.float64)
    chi[0], chi[squares] = 0.0, 1.0
    return chi


def _difference_index(q: int) -> torch.Tensor:
    """D[i, j] = the element a_j - a_i (digit-wise subtraction mod p): int64 [q, q]."""
    p, e = prime_power(q)
    elements = torch.arange(q)
    index = torch.zeros(q, q, dtype=torch.int64)
    for t in range(e):
        digit = elements // p**t % p  # [q]
        index += (digit.unsqueeze(0) - digit.unsqueeze(1)) % p * p**t
    return index


def sylvester(n: int) -> torch.Tensor:
    """±1 Hadamard matrix of order n = 2^m, fp64 [n, n]."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Sylvester construction needs a power of two, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _jacobsthal(q: int) -> torch.Tensor:
    """Q[i, j] = χ(a_j − a_i) over GF(q), χ the quadratic character: fp64 [q, q] in {-1, 0, 1}."""
    return _quadratic_character(q)[_difference_index(q)]


def paley1(q: int) -> torch.Tensor:
    """Order q+1 for a prime power q ≡ 3 mod 4: H = I + S, S = [[0, 1ᵀ], [-1, Q]] (skew)."""
    if q % 4 != 3 or prime_power(q) is None:
        raise ValueError(f"Paley I needs a prime power q ≡ 3 mod 4, got {q}")
    s = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, _jacobsthal(q)
    return s + torch.eye(q + 1, dtype=torch.float64)


def paley2(q: int) -> torch.Tensor:
    """Order 2(q+1) for a prime power q ≡ 1 mod 4, from the symmetric conference matrix
    C = [[0, 1ᵀ], [1, Q]]: each 0 becomes [[1, -1], [-1, -1]], each ±1 becomes ±[[1, 1], [1, -1]]."""
    if q % 4 != 1 or prime_power(q) is None:
        raise ValueError(f"Paley II needs a prime power q ≡ 1 mod 4, got {q}")
    c = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(q)
    zero_block = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    sign_block = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    return torch.kron(c, sign_block) + torch.kron((c == 0).double(), zero_block)


# Cores taken from a table instead of a Paley construction of the same order. 36: the matrix QuaRot and
# deepcompressor (the QoQ reference) use, from N. J. A. Sloane's library of Hadamard matrices. Paley II(17)
# is another order-36 Hadamard matrix; with the reference's, SmolLM2's rotation (576 = 36 x 16) is the
# reference's exactly, so the two tools compare pass by pass (docs/design.md §3.6).
TABLE_CORES = {
    36: (
        "++++++++++++++++++-+++++++++++++++++",
        "++++-+---++---+-+++-++-+---++---+-++",
        "+++++-+---++---+-+++-++-+---++---+-+",
        "++++++-+---++---+-+++-++-+---++---+-",
        "+-+++++-+---++---++-++-++-+---++---+",
        "++-+++++-+---++---++-++-++-+---++---",
        "+-+-+++++-+---++--+-+-++-++-+---++--",
        "+--+-+++++-+---++-+--+-++-++-+---++-",
        "+---+-+++++-+---+++---+-++-++-+---++",
        "++---+-+++++-+---+++---+-++-++-+---+",
        "+++---+-+++++-+---+++---+-++-++-+---",
        "+-++---+-+++++-+--+-++---+-++-++-+--",
        "+--++---+-+++++-+-+--++---+-++-++-+-",
        "+---++---+-+++++-++---++---+-++-++-+",
        "++---++---+-+++++-++---++---+-++-++-",
        "+-+---++---+-++++++-+---++---+-++-++",
        "++-+---++---+-++++++-+---++---+-++-+",
        "+++-+---++---+-++++++-+---++---+-++-",
        "-+++++++++++++++++------------------",
        "+-++-+---++---+-++----+-+++--+++-+--",
        "++-++-+---++---+-+-----+-+++--+++-+-",
        "+++-++-+---++---+-------+-+++--+++-+",
        "+-++-++-+---++---+-+-----+-+++--+++-",
        "++-++-++-+---++-----+-----+-+++--+++",
        "+-+-++-++-+---++---+-+-----+-+++--++",
        "+--+-++-++-+---++--++-+-----+-+++--+",
        "+---+-++-++-+---++-+++-+-----+-+++--",
        "++---+-++-++-+---+--+++-+-----+-+++-",
        "+++---+-++-++-+------+++-+-----+-+++",
        "+-++---+-++-++-+---+--+++-+-----+-++",
        "+--++---+-++-++-+--++--+++-+-----+-+",
        "+---++---+-++-++-+-+++--+++-+-----+-",
        "++---++---+-++-++---+++--+++-+-----+",
        "+-+---++---+-++-++-+-+++--+++-+-----",
        "++-+---++---+-++-+--+-+++--+++-+----",
        "+++-+---++---+-++----+-+++--+++-+---",
    ),
}


def table_core(k: int) -> torch.Tensor:
    """The ±1 core of order k in TABLE_CORES, fp64 [k, k]."""
    return torch.tensor([[1.0 if c == "+" else -1.0 for c in row] for row in TABLE_CORES[k]], dtype=torch.float64)


CORES = {"table": table_core, "paley1": lambda k: paley1(k - 1), "paley2": lambda k: paley2(k // 2 - 1)}


def _core_construction(k: int) -> str | None:
    """Which table entry or Paley construction gives a Hadamard matrix of order k (k > 4), if any."""
    if k % 4 or k <= 4:
        return None
    if k in TABLE_CORES:
        return "table"
    if (k - 1) % 4 == 3 and prime_power(k - 1):
        return "paley1"
    if (k // 2 - 1) % 4 == 1 and prime_power(k // 2 - 1):
        return "paley2"
    return None


def hadamard_plan(n: int) -> tuple[str, int, int] | None:
    """(construction, core order k, Sylvester order 2^m) with n = k·2^m, or None when no construction
    here reaches n. Pure powers of two are ("sylvester", 1, n); otherwise the largest 2^m whose cofactor
    has a Paley core is taken (the smallest core to build)."""
    if n < 1:
        raise ValueError(f"Hadamard order must be positive, got {n}")
    two_power = n & -n  # the largest 2^m dividing n
    if two_power == n:
        return "sylvester", 1, n
    while two_power >= 1:
        construction = _core_construction(n // two_power)
        if construction is not None:
            return construction, n // two_power, two_power
        two_power //= 2
    return None


def random_orthogonal(n: int, seed: int) -> torch.Tensor:
    """QR of a seeded Gaussian, with R's diagonal made positive (so Q is unique and Haar-distributed)."""
    g = torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    q, r = torch.linalg.qr(g)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


SYLVESTER_FACTOR = 64  # Sylvester(2^m) = Sylvester(64) ⊗ ... : each factor a small dense matmul


class KroneckerOrthogonal:
    """R = (F₁ ⊗ F₂ ⊗ …)·scale, orthogonal [n, n] fp64, applied factor by factor: x·R costs
    n·Σ|Fᵢ| multiply-adds per row instead of n² (4096 = 64·64: 32× fewer)."""

    def __init__(self, factors: list[torch.Tensor], scale: float = 1.0):
        self.factors, self.scale = factors, scale  # fp64 [f, f] each, built on the CPU
        self.size = math.prod(f.shape[0] for f in factors)
        self._on_device: dict[torch.device, list[torch.Tensor]] = {torch.device("cpu"): factors}

    def factors_on(self, device: torch.device) -> list[torch.Tensor]:
        """The factors on `device`, copied there once (the rotation is cached and shared across blocks)."""
        device = torch.device(device)
        if device not in self._on_device:
            self._on_device[device] = [f.to(device) for f in self.factors]
        return self._on_device[device]

    def right(self, x: torch.Tensor) -> torch.Tensor:
        """x·R for x [..., n], in fp64."""
        if x.shape[-1] != self.size:
            raise ValueError(f"rotation of size {self.size} applied to a last dimension of {x.shape[-1]}")
        lead, y, pre = x.shape[:-1], x.double().reshape(-1, self.size), 1
        for f in self.factors_on(x.device):  # the (i, j) index of A ⊗ B is i·|B| + j: factor i acts on digit i
            post = self.size // (pre * f.shape[0])
            y = torch.einsum("mpfq,fg->mpgq", y.reshape(-1, pre, f.shape[0], post), f)
            pre *= f.shape[0]
        return (y * self.scale).reshape(*lead, self.size)

    def right_(self, w: torch.Tensor, rows: int = 4096) -> torch.Tensor:
        """w ← w·R in place for w [M, n], computed in fp64 a few rows at a time: the fp64 temporaries
        stay small even for a [vocab, hidden] embedding. Returns w."""
        for r0 in range(0, w.shape[0], rows):
            w[r0 : r0 + rows] = self.right(w[r0 : r0 + rows]).to(w.dtype)
        return w

    def left_transposed(self, w: torch.Tensor) -> torch.Tensor:
        """Rᵀ·w for w [n, K], in fp64."""
        return self.right(w.T).T

    def dense(self) -> torch.Tensor:
        """R [n, n] fp64."""
        return self.right(torch.eye(self.size, dtype=torch.float64))  # on the CPU


def _sylvester_factors(n: int) -> list[torch.Tensor]:
    factors = []
    while n > 1:
        f = min(n, SYLVESTER_FACTOR)
        factors.append(sylvester(f))
        n //= f
    return factors or [sylvester(1)]


def _integer_factors(n: int) -> tuple[list[torch.Tensor], str] | None:
    """±1 Hadamard matrices whose Kronecker product is a Hadamard matrix of order n (the Paley core,
    then Sylvester factors of at most SYLVESTER_FACTOR), and its kind; None (see `hadamard_plan`)."""
    plan = hadamard_plan(n)
    if plan is None:
        return None
    construction, k, two_power = plan
    if construction == "sylvester":
        return _sylvester_factors(n), f"sylvester({n})"
    core = CORES[construction](k)  # [k, k]
    if two_power == 1:
        return [core], f"{construction}({k})"
    return [core, *_sylvester_factors(two_power)], f"{construction}({k})xsylvester({two_power})"


def integer_hadamard(n: int) -> tuple[torch.Tensor, str] | None:
    """A ±1 matrix H [n, n] fp64 with H·Hᵀ = n·I and its kind, or None (see `hadamard_plan`)."""
    found = _integer_factors(n)
    if found is None:
        return None
    factors, kind = found
    return KroneckerOrthogonal(factors).dense(), kind


@lru_cache(maxsize=8)
def _cached(n: int, seed: int) -> tuple[KroneckerOrthogonal, str]:
    found = _integer_factors(n)
    if found is None:
        return KroneckerOrthogonal([random_orthogonal(n, seed)]), f"random-orthogonal(seed={seed})"
    factors, kind = found
    return KroneckerOrthogonal(factors, 1 / math.sqrt(n)), f"hadamard-{kind}"


def hadamard_rotation(n: int, seed: int = 0) -> tuple[KroneckerOrthogonal, str]:
    """An orthogonal rotation of order n (a normalized Hadamard matrix when one is constructible, kept
    as Kronecker factors) and its kind for the manifest. Cached by (n, seed): treat it as read-only."""
    rotation, kind = _cached(int(n), int(seed))
    if kind.startswith("random"):  # warned on every call, not only the first (cached) one
        warnings.warn(f"no Hadamard construction for size {n}: using a random orthogonal matrix "
                      f"(seed={seed})", stacklevel=2)
    return rotation, kind


def hadamard(n: int, seed: int = 0) -> tuple[torch.Tensor, str]:
    """`hadamard_rotation` as a dense orthogonal matrix [n, n] fp64."""
    rotation, kind = hadamard_rotation(n, seed)
    return rotation.dense(), kind


ONLINE_SEED = 0  # the random-orthogonal fallback's seed for online rotations: quantizer and runtime agree


class OnlineRotation:
    """x ← x·R at run time for an input of size n (QuaRot's online Hadamard before down_proj): the same
    R `hadamard_rotation(n, ONLINE_SEED)` gives wherever it is built (pipeline and executor), applied in
    fp64 factor by factor, returned in x's dtype. Usable as MLP.down_input_transform."""

    def __init__(self, n: int):
        self.rotation, self.kind = hadamard_rotation(n, ONLINE_SEED)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.rotation.right(x).to(x.dtype)
