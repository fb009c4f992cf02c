"""gemm.py's variant table against the C++ side (CPU: parses csrc/gemm_w4a8_params.h and gemm_bindings.cpp).

gemm.VARIANTS (name -> id) and its limits are what Python routes and checks by; the header's Variant
enum and constants are what the kernels are launched and checked by. They are kept by hand in two
languages, so this holds them to one another: names, ids and every limit both sides enforce.
"""

import re

from qoq.runtime_cuda import gemm
from qoq.runtime_cuda.build import CSRC

PARAMS = (CSRC / "gemm_w4a8_params.h").read_text()
BINDINGS = (CSRC / "gemm_bindings.cpp").read_text()


def _enum() -> dict[str, int]:
    body = re.search(r"enum Variant \{(.*?)\};", PARAMS, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    return {name: int(value) for name, value in re.findall(r"(\w+)\s*=\s*(\d+)", body)}


def _python_name(enum_name: str) -> str:
    # TILED128_WIDE -> tiled128w, WG64X64_K2 -> wg64x64k2, GEMV16P -> gemv16p
    return enum_name.lower().replace("_wide", "w").replace("_", "")


def _constexpr(name: str, text: str = PARAMS) -> str:
    return re.search(rf"constexpr int {name} = (\w+);", text).group(1)


def _ids(expr: str) -> set[int]:
    """The ids of the enum names an expression of the bindings mentions."""
    enum = _enum()
    return {enum[n] for n in re.findall(r"qoq_gemm::(\w+)", expr) if n in enum}


def test_the_enum_is_the_variant_table():
    enum = _enum()
    assert {_python_name(n): i for n, i in enum.items()} == gemm.VARIANTS
    assert enum[_constexpr("LAST_VARIANT")] == max(gemm.VARIANTS.values())
    assert sorted(gemm.VARIANTS.values()) == list(range(1, len(gemm.VARIANTS) + 1))  # the bindings check a range


def test_the_limits_agree():
    assert int(_constexpr("GEMV_MAX_M")) == gemm.GEMV_MAX_M
    assert int(_constexpr("GEMVP_MAX_M")) == gemm.GEMVP_MAX_M
    # gemm.py checks groups as multiples of 64 (_operands); the header's GROUP_MULTIPLE says the same
    assert int(_constexpr("GROUP_MULTIPLE")) == 64
    assert "N * K / 2 >= (int64_t{1} << 32)" in BINDINGS and gemm.GEMVP_MAX_WEIGHT_BYTES == 1 << 32
    gemv_groups = re.search(r"if \(gemv && p\.group != (\d+) && p\.group != (\d+)\)", BINDINGS).groups()
    assert {int(g) for g in gemv_groups} | {-1} == set(gemm.GEMV_GROUPS)


def test_the_kernel_families_agree():
    by_id = {i: v for v, i in gemm.VARIANTS.items()}
    gemv = re.search(r"const bool gemv = ([^;]+);", BINDINGS).group(1)
    assert {by_id[i] for i in _ids(gemv)} == {v for v in gemm.VARIANTS if v.startswith("gemv")}
    lo, hi = re.search(r"const bool wgmma = variant >= qoq_gemm::(\w+) && variant <= qoq_gemm::(\w+);",
                       BINDINGS).groups()
    enum = _enum()
    assert {by_id[i] for i in range(enum[lo], enum[hi] + 1)} == {v for v in gemm.VARIANTS if v.startswith("wg")}
    # per group the GEMVs and wgmma kernels take the code sums (biased u8 weights)
    assert gemm.BIASED_IDS == _ids(gemv) | set(range(enum[lo], enum[hi] + 1))
    tiled = re.search(r"if \(tiled && (variant != [^\n]+)\n", BINDINGS).group(1)
    assert {by_id[i] for i in _ids(tiled)} == set(gemm.TILED_VARIANTS)
