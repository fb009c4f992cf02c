"""Seeded shape samplers for the kernel fuzz (bench/kernel_fuzz_h200.py, tests/runtime_cuda/test_kernel_fuzz_cuda.py).

Pure Python (random.Random): a seed names the same cases on every machine, and nothing here needs torch.

GEMM cases, `gemm_cases(seed, n)` -> [GemmCase(m, n, k, group, weight, bias)]:
  * group 64, 128 or -1 (per channel), equally often;
  * K and N log-uniform in [256, 65536], each rounded to a multiple of 32, 64 or 128 (drawn per dimension);
    K also to a multiple of the group (what the kernels allow: N, K multiples of 32, K % group == 0);
  * M in 1..4096: a quarter 1..16 (the GEMV / A-fragment tile regime), a quarter 17..128, the rest
    log-uniform from 17 up to the cap; odd M as often as even;
  * caps, so that 2,000 cases run in a few minutes on one H200: N*K <= 2^27 (a 64 MiB packed weight, a
    256 MiB fp16 one for the baseline), M*K <= 2^25, M*N <= 2^26 (the inputs and outputs of one call). The
    dimension drawn second (K or N, which one is random) is drawn within what the first leaves under the cap,
    so both extremes of each appear;
  * a weight (n, k, group, bias) serves `ms_per_weight` consecutive cases of different M (`weight` numbers
    it): quantizing a random weight is the costly part of building a case.

Attention cases, `attention_cases(seed, n)` -> [AttentionCase(batch, lens, hkv, group, dim, num_splits,
num_stages, max_seq_len)]:
  * batch log-uniform in 1..256; KV heads 1..8 (1 and 8 twice as likely); GQA group 1..8 uniform (3, 5, 7
    included); head dim 64 or 128;
  * lengths in 1..8192 from a per-case longest length Lmax (log-uniform): all equal to Lmax (a quarter),
    uniform in 1..Lmax (half), or log-uniform in 1..Lmax (a quarter); a fifth of the sequences snapped to a
    page edge (64j - 1, 64j, 64j + 1);
  * caps: batch * Lmax * hkv <= 2^22 (the dense fp16 K/V of the SDPA baseline, padded to Lmax: up to 2 GiB
    at D 128), Lmax drawn under it; sum(lens) * hkv <= 2^21 token-heads (KV4 pools up to 2 x 143 MB at D 128),
    lengths halved until under it;
  * num_splits None (split_plan decides) for 60%, else pinned to 1..64 (log-uniform); num_stages None
    except 1 in 5 (pinned to 2, or 3 at D 128); max_seq_len = max(lens), or for 1 in 7 cases more (up to
    +1024 tokens, the page table as wide), as a serving engine with static shapes passes it.

PINNED_GEMM / PINNED_ATTENTION: the shapes where held-out measurements found the kernels slower than FP16
(hidden sizes of 1-2B models at M >= 97; decode at B = 7 with a group of 7; one KV head per GPU), checked and
timed next to the random ones. REGRESSION_GEMM: shapes an earlier fuzz run found wrong, checked only.
"""

from __future__ import annotations

import math
import random
from typing import Callable, NamedTuple, Sequence

DIM_MIN, DIM_MAX = 256, 65536
M_MAX = 4096
GEMM_GROUPS = (64, 128, -1)
MAX_NK = 1 << 27
MAX_MK = 1 << 25
MAX_MN = 1 << 26

BATCH_MAX = 256
LEN_MAX = 8192
PAGE = 64
MAX_TOKEN_HEADS = 1 << 21  # sum(lens) * hkv
MAX_DENSE_TOKEN_HEADS = 1 << 22  # batch * Lmax * hkv
MAX_SPLITS = 64


class GemmCase(NamedTuple):
    m: int
    n: int
    k: int
    group: int  # 64, 128 or -1 (per channel)
    weight: int  # which drawn weight: consecutive cases share one
    bias: bool


class AttentionCase(NamedTuple):
    batch: int
    lens: tuple[int, ...]
    hkv: int
    group: int  # query heads per KV head
    dim: int
    num_splits: int | None
    num_stages: int | None
    max_seq_len: int


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _dim(rng: random.Random, multiple: int, hi: int) -> int:
    """A multiple of `multiple`, log-uniform in [DIM_MIN, hi] (hi >= DIM_MIN)."""
    lo_units, hi_units = -(-DIM_MIN // multiple), hi // multiple
    return multiple * min(hi_units, max(lo_units, round(_log_uniform(rng, DIM_MIN, hi) / multiple)))


def _m(rng: random.Random, cap: int) -> int:
    u = rng.random()
    if u < 1 / 4 or cap <= 16:
        return rng.randint(1, min(16, cap))
    if u < 1 / 2:
        return rng.randint(17, min(128, cap))
    return min(cap, int(_log_uniform(rng, 17, cap + 1)))


def gemm_cases(seed: int, n: int, ms_per_weight: int = 4, max_nk: int = MAX_NK, max_mk: int = MAX_MK,
               max_mn: int = MAX_MN) -> list[GemmCase]:
    """`n` GEMM cases from `seed` (module docstring), grouped by weight."""
    if max_nk < DIM_MIN * DIM_MIN:
        raise ValueError(f"max_nk must allow N = K = {DIM_MIN}, got {max_nk}")
    rng = random.Random(f"gemm:{seed}")
    cases: list[GemmCase] = []
    weight = 0
    while len(cases) < n:
        group = rng.choice(GEMM_GROUPS)
        k_multiple = max(rng.choice((32, 64, 128)), group)
        n_multiple = rng.choice((32, 64, 128))
        if rng.random() < 0.5:
            k = _dim(rng, k_multiple, min(DIM_MAX, max_nk // DIM_MIN))
            nn = _dim(rng, n_multiple, min(DIM_MAX, max_nk // k))
        else:
            nn = _dim(rng, n_multiple, min(DIM_MAX, max_nk // DIM_MIN))
            k = _dim(rng, k_multiple, min(DIM_MAX, max_nk // nn))
        bias = rng.random() < 0.5
        m_cap = max(1, min(M_MAX, max_mk // k, max_mn // nn))
        for _ in range(min(ms_per_weight, n - len(cases))):
            cases.append(GemmCase(_m(rng, m_cap), nn, k, group, weight, bias))
        weight += 1
    return cases


def _length(rng: random.Random, mode: str, lmax: int) -> int:
    if mode == "equal":
        return lmax
    n = rng.randint(1, lmax) if mode == "uniform" else int(_log_uniform(rng, 1, lmax + 1))
    if rng.random() < 0.2:  # a page edge
        n = PAGE * max(1, round(n / PAGE)) + rng.choice((-1, 0, 1))
    return max(1, min(lmax, n))


def attention_cases(seed: int, n: int, max_batch: int = BATCH_MAX, max_len: int = LEN_MAX,
                    max_token_heads: int = MAX_TOKEN_HEADS,
                    max_dense_token_heads: int = MAX_DENSE_TOKEN_HEADS) -> list[AttentionCase]:
    """`n` decode-attention cases from `seed` (module docstring)."""
    rng = random.Random(f"attention:{seed}")
    cases = []
    for _ in range(n):
        batch = min(max_batch, max(1, int(_log_uniform(rng, 1, max_batch + 1))))
        hkv = rng.choice((1, 1, 2, 3, 4, 5, 6, 7, 8, 8))
        group = rng.randint(1, 8)
        dim = rng.choice((64, 128))
        lmax_cap = max(1, min(max_len, max_dense_token_heads // (batch * hkv)))
        lmax = min(lmax_cap, max(1, int(_log_uniform(rng, 1, lmax_cap + 1))))
        mode = rng.choices(("equal", "uniform", "log"), (1, 2, 1))[0]
        lens = [_length(rng, mode, lmax) for _ in range(batch)]
        while sum(lens) * hkv > max_token_heads:  # halved (keeping their shape) under the KV4 cap
            lens = [max(1, x // 2) for x in lens]
        num_splits = None if rng.random() < 0.6 else min(MAX_SPLITS, int(_log_uniform(rng, 1, MAX_SPLITS + 1)))
        num_stages = None if rng.random() < 0.8 else rng.choice((2, 3) if dim == 128 else (2,))
        longest = max(lens)
        max_seq_len = longest if rng.random() >= 1 / 7 else min(max_len, longest + rng.randint(1, 1024))
        max_seq_len = max(longest, max_seq_len)
        cases.append(AttentionCase(batch, tuple(lens), hkv, group, dim, num_splits, num_stages, max_seq_len))
    return cases


# Held-out shapes slower than FP16 (the item 4): Qwen2.5-1.5B / Llama-3.2-1B hidden sizes at M >= 97.
PINNED_GEMM_NK = ((1536, 1536), (2048, 1536), (1536, 2048), (2048, 2048))  # (N, K)
PINNED_GEMM_M = (97, 128, 256, 512, 1024)
PINNED_GEMM_GROUPS = (128, -1)


def pinned_gemm_cases() -> list[GemmCase]:
    cases, weight = [], -1  # negative weight ids: never a fuzz weight
    for group in PINNED_GEMM_GROUPS:
        for n, k in PINNED_GEMM_NK:
            cases += [GemmCase(m, n, k, group, weight, False) for m in PINNED_GEMM_M]
            weight -= 1
    return cases


# Shapes a fuzz run (seed 20261202, an H200's 132 SMs) found wrong, checked but not timed: gemv16p where K is
# not a multiple of 128 (a warp's last run of 4 k-tiles is partial), K >= 4096 (that warp has >= 3 runs per
# column block) and N / 32 > SMs (a block goes on to another column block). (N, K, group)
REGRESSION_GEMM_NKG = ((11968, 4544, 64), (21504, 5472, -1), (8704, 5824, 64), (7424, 6592, 64), (6656, 6720, 64),
                       (8512, 6976, 64), (6848, 8384, 64), (14400, 8544, -1), (11392, 9536, 64),
                       (5664, 10560, 64), (6912, 14624, -1), (5984, 15040, 64), (6016, 16320, -1))
REGRESSION_GEMM_M = (1, 5, 15)


def regression_gemm_cases() -> list[GemmCase]:
    """REGRESSION_GEMM_NKG at each REGRESSION_GEMM_M, every other weight with a bias; weight ids below
    pinned_gemm_cases' (negative: never a fuzz weight)."""
    return [GemmCase(m, n, k, group, -100 - i, i % 2 == 0)
            for i, (n, k, group) in enumerate(REGRESSION_GEMM_NKG) for m in REGRESSION_GEMM_M]


def pinned_attention_cases() -> list[AttentionCase]:
    """B = 7 with a GQA group of 7 (1, 2 and 4 KV heads); 8 query heads over 1 KV head at B = 96, L = 700
    (a 70B model at 8-way tensor parallelism), D 128."""
    cases = [AttentionCase(7, (length,) * 7, hkv, 7, 128, None, None, length)
             for hkv in (1, 2, 4) for length in (512, 2048)]
    cases.append(AttentionCase(96, (700,) * 96, 1, 8, 128, None, None, 700))
    return cases


def m_bucket(m: int) -> str:
    for hi, name in ((1, "1"), (16, "2-16"), (64, "17-64"), (256, "65-256"), (1024, "257-1024")):
        if m <= hi:
            return name
    return "1025-4096"


def batch_bucket(b: int) -> str:
    for hi, name in ((1, "1"), (8, "2-8"), (32, "9-32"), (128, "33-128")):
        if b <= hi:
            return name
    return "129-256"


def timing_order(n: int, class_of: Callable[[int], object], seed: int, first: Sequence[int] = ()) -> list[int]:
    """Indices 0..n-1 in the order to time them: `first` (pinned cases), then one case of every class
    (`class_of(i)`) in a seeded random order, then the rest, shuffled; a time budget cuts the tail."""
    rng = random.Random(f"timing:{seed}")
    pinned = set(first)
    rest = [i for i in range(n) if i not in pinned]
    rng.shuffle(rest)
    seen = {class_of(i) for i in first}
    head, tail = [], []
    for i in rest:
        c = class_of(i)
        (tail if c in seen else head).append(i)
        seen.add(c)
    return list(first) + head + tail


def distribution(values: Sequence[float]) -> dict | None:
    """min, p10 (nearest rank below), median, max, count and how many are below 1.0; None when empty."""
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    median = v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
    return dict(n=len(v), min=round(v[0], 4), p10=round(v[int(0.1 * (len(v) - 1))], 4), median=round(median, 4),
                max=round(v[-1], 4), below_1=sum(x < 1.0 for x in v))
