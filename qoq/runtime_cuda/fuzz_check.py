"""Correctness runner of the kernel fuzz (bench/kernel_fuzz_h200.py; tests/runtime_cuda/test_kernel_fuzz_cuda.py):
every case of qoq.runtime_cuda.fuzz_shapes against its pure-torch reference.

GEMM: CudaW4A8Linear.forward (its quantization kernel, then the GEMM auto_variant picks, launched as a
programmatic dependent as it always is) against IntegerLinear built from the same export_linear tensors of a
random weight (quantize_weight): relative error (Frobenius) below GEMM_REL_TOL, outputs finite.
Decode attention: attention.decode_attention against attention_reference.decode_attention on the same KV4
pages (sequences' pages shuffled over pools of garbage bytes, wider page tables holding garbage page ids):
relative error below ATTENTION_REL_TOL (tests/runtime_cuda/test_attention_cuda.py's bound). Every fourth
decode case (index % 4 == 1) keeps a k bias outside the cache (design §3.4, k_bias_inputs): its bound is
K_BIAS_REL_TOL, the bias term's fp16 arithmetic costing what fp16 keys cost.

Every `busy_every`-th case first queues large unrelated kernels and leaves the allocator's free blocks full of
garbage (busy_gpu), with no sync between them and the kernels under test: a programmatic dependent's race
with the kernel ahead shows only when launches queue up. Every odd-numbered decode case (the busy ones
among them) launches with enable_pdl, as the engine does.

Inputs are built on the given device from seeds, so the reference side runs on the CPU too: the CPU tests
pass stand-ins for the kernels (reference_linear: the pure-torch twin of the CUDA linear).
"""

from __future__ import annotations

import math
import time
from itertools import groupby
from typing import Callable, Iterable

import torch

from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.weights import quantize_weight
from qoq.runtime_cuda import attention_reference as ref
from qoq.runtime_cuda.fuzz_shapes import AttentionCase, GemmCase
from qoq.runtime_cuda.reference import accumulate, epilogue, integer_weight, reference_quant

GEMM_REL_TOL = 2e-3  # CudaW4A8Linear vs IntegerLinear: tests/runtime_cuda/test_pdl_sequences.py's bound
ATTENTION_REL_TOL = 1e-3
K_BIAS_REL_TOL = 3e-3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64; inf when a has a non-finite value or the shapes differ (rows store that
    as err None)."""
    if a.shape != b.shape or not torch.isfinite(a).all():
        return math.inf
    norm = b.double().norm().item()
    diff = (a.double() - b.double()).norm().item()
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


def _err(err: float) -> float | None:
    return float(f"{err:.3g}") if math.isfinite(err) else None


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed & 0x7FFF_FFFF_FFFF)


def busy_gpu() -> None:
    """Queue large unrelated kernels (~2 ms) and leave the caching allocator's free blocks full of garbage."""
    junk = torch.randint(-128, 127, (1 << 28,), dtype=torch.int8, device="cuda")  # 256 MiB, freed below
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    a = a @ a.T * 1e-3
    del junk, a


# -- GEMM ------------------------------------------------------------------------------------------------

def gemm_tensors(case: GemmCase, seed: int, device) -> dict[str, torch.Tensor]:
    """export_linear tensors ("w.*") of a random weight [N, K] quantized at the case's group, with a bias if
    the case has one."""
    gen = _generator(device, seed * 1_000_003 + case.weight)
    w = torch.randn(case.n, case.k, device=device, generator=gen)
    bias = torch.randn(case.n, device=device, generator=gen).half() if case.bias else None
    return export_linear("w", quantize_weight(w, case.group), bias)


def gemm_input(case: GemmCase, index: int, seed: int, device) -> torch.Tensor:
    """fp16 [M, K] tokens, four outlier channels (x20) as real activations have."""
    gen = _generator(device, seed * 7_000_003 + index)
    x = torch.randn(case.m, case.k, device=device, generator=gen)
    x[:, :4] *= 20
    return x.half()


class reference_linear(torch.nn.Module):  # noqa: N801 (used like a class name: a stand-in for CudaW4A8Linear)
    """The pure-torch twin of CudaW4A8Linear (reference.reference_quant, then reference_gemm's integer weight,
    exact accumulation and epilogue): the CPU tests' stand-in for the kernel."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.t = {key[2:]: v for key, v in tensors.items()}
        self.w_int = integer_weight(self.t["qweight"], s2_scales=self.t.get("s2_scales"),
                                    s2_zeros=self.t.get("s2_zeros"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qx, s_x, xsum = reference_quant(x, sums="inputs")
        per_channel = "s1_szeros" in self.t
        return epilogue(accumulate(qx, self.w_int), s_x, self.t["s1_scales"], s1_szeros=self.t.get("s1_szeros"),
                        xsum=xsum if per_channel else None, bias=self.t.get("bias"))


def cuda_linear(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    from qoq.runtime_cuda.linear import CudaW4A8Linear

    return CudaW4A8Linear.from_tensors(tensors, "w")


def _auto_pick(case: GemmCase, device) -> str | None:
    """The kernel CudaW4A8Linear's GEMM runs for this case (auto_variant, as a programmatic dependent)."""
    if torch.device(device).type != "cuda":
        return None
    from qoq.runtime_cuda.gemm import _multiprocessors, auto_variant, is_hopper

    dev = torch.device(device)
    dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    return auto_variant(case.m, case.n, case.k, case.group, _multiprocessors(dev), is_hopper(dev), pdl=True)


def check_gemm_cases(cases: Iterable[GemmCase], seed: int, device="cuda",
                     make_linear: Callable[[dict], torch.nn.Module] = cuda_linear, busy_every: int = 4,
                     deadline: float | None = None, on_row: Callable[[dict], None] | None = None,
                     start: int = 0) -> list[dict]:
    """Check each case (numbered from `start`); -> one compact row per case: i, m, n, k, g, bias, busy,
    variant (the kernel auto_variant picks), err, ok. Stops early (fewer rows) at `deadline` (time.time())."""
    busy_ok = torch.device(device).type == "cuda"
    rows: list[dict] = []
    index = start
    for _, weight_cases in groupby(cases, key=lambda c: (c.weight, c.n, c.k, c.group, c.bias)):
        weight_cases = list(weight_cases)
        if deadline is not None and time.time() > deadline:
            break
        try:
            t = gemm_tensors(weight_cases[0], seed, device)
            lin, integer, setup_error = make_linear(t), IntegerLinear.from_tensors(t, "w"), None
        except Exception as exc:  # every case of this weight fails with the message
            lin = integer = None
            setup_error = "weight: " + error_message(exc)
        for case in weight_cases:
            busy = busy_ok and busy_every > 0 and index % busy_every == busy_every - 1
            err, error = math.inf, setup_error
            if error is None:
                try:
                    x = gemm_input(case, index, seed, device)
                    expected = integer(x)
                    if busy:
                        torch.cuda.synchronize()
                        busy_gpu()
                    err = rel_err(lin(x), expected)
                except Exception as exc:  # a launch the wrapper refuses is a failure, recorded with its message
                    error = error_message(exc)
            row = dict(i=index, m=case.m, n=case.n, k=case.k, g=case.group, bias=case.bias, busy=busy,
                       variant=_auto_pick(case, device), err=_err(err), ok=err < GEMM_REL_TOL)
            if error:
                row["error"] = error
            rows.append(row)
            if on_row:
                on_row(row)
            index += 1
        del lin, integer
    return rows


def error_message(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


# -- decode attention ------------------------------------------------------------------------------------

def attention_inputs(case: AttentionCase, index: int, seed: int, device):
    """-> q [B, hkv*group, D] fp16, k_pool, v_pool [P, page_bytes] uint8, page_table int32 [B,
    ceil(max_seq_len / 64)], seq_lens int32 [B] on `device`: each sequence's K/V written as KV4 at shuffled
    pages of pools of garbage bytes; table entries past a sequence's pages hold garbage (valid) page ids.
    Keys are scaled by 1 or 2 (a peakier softmax), and one head of the first token is flat (max == min)."""
    gen = _generator(device, seed * 9_000_011 + index)
    pages = [math.ceil(n / ref.PAGE_TOKENS) for n in case.lens]
    total = sum(pages) + 3
    width = math.ceil(case.max_seq_len / ref.PAGE_TOKENS)
    pb = ref.page_bytes(case.hkv, case.dim)
    pools = [torch.randint(0, 256, (total, pb), dtype=torch.uint8, device=device, generator=gen) for _ in range(2)]
    perm = torch.randperm(total, device=device, generator=gen)
    table = torch.randint(0, total, (case.batch, width), dtype=torch.int32, device=device, generator=gen)
    slots, start = [], 0
    for i, (n, p) in enumerate(zip(case.lens, pages)):
        ids = perm[start : start + p]
        start += p
        table[i, :p] = ids.int()
        slots.append((ids[:, None] * ref.PAGE_TOKENS + torch.arange(ref.PAGE_TOKENS, device=device)).flatten()[:n])
    slots = torch.cat(slots)
    k_scale = 2.0 if index % 3 == 2 else 1.0
    for pool, scale in zip(pools, (k_scale, 1.0)):
        x = torch.randn(len(slots), case.hkv, case.dim, device=device, generator=gen) * scale
        x[0, 0] = 1.5
        ref.write_kv4(pool, x.half(), slots)
    q = torch.randn(case.batch, case.hkv * case.group, case.dim, device=device, generator=gen).half()
    seq_lens = torch.tensor(case.lens, dtype=torch.int32, device=device)
    return q, pools[0], pools[1], table, seq_lens


def k_bias_inputs(case: AttentionCase, index: int, seed: int, device) -> tuple:
    """(b [Hkv, D] fp32, cos, sin [max_seq_len, D/2] fp32): N(0, 2) biases with Qwen2.5-like channels of ±20
    and 8, and RoPE tables of theta 1e6."""
    gen = _generator(device, seed * 7_000_003 + index)
    b = torch.randn(case.hkv, case.dim, device=device, generator=gen) * 2
    b[:, case.dim // 2 - 1], b[:, case.dim - 1], b[:, 2] = 20.0, -20.0, 8.0
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, case.dim, 2, device=device).float() / case.dim)
    angles = torch.arange(case.max_seq_len, device=device).float()[:, None] * inv_freq
    return b, angles.cos(), angles.sin()


def cuda_attend(q, k_pages, v_pages, page_table, seq_lens, max_seq_len, num_splits, num_stages, pdl, k_bias=None):
    from qoq.runtime_cuda.attention import decode_attention

    return decode_attention(q, k_pages, v_pages, page_table, seq_lens, max_seq_len, num_splits=num_splits,
                            num_stages=num_stages, enable_pdl=pdl, k_bias=k_bias)


def reference_attend(q, k_pages, v_pages, page_table, seq_lens, max_seq_len, num_splits, num_stages, pdl,
                     k_bias=None):
    """The CPU tests' stand-in for the kernel."""
    return ref.decode_attention(q, k_pages, v_pages, page_table, seq_lens, k_bias=k_bias)


def attention_plan(case: AttentionCase, device) -> tuple[int, int] | None:
    """(num_splits, num_stages) decode_attention launches the case with, on `device` (None off CUDA)."""
    if torch.device(device).type != "cuda":
        return None
    from qoq.runtime_cuda.attention import plan_stages, split_plan

    sms = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    splits = split_plan(case.batch, case.hkv, case.max_seq_len, sms, case.num_splits)[0]
    stages = case.num_stages or plan_stages(case.batch, case.hkv, splits, case.dim, sms)
    return splits, stages


def check_attention_cases(cases: Iterable[AttentionCase], seed: int, device="cuda", attend: Callable = cuda_attend,
                          busy_every: int = 4, deadline: float | None = None,
                          on_row: Callable[[dict], None] | None = None, start: int = 0) -> list[dict]:
    """Check each case (numbered from `start`); -> one compact row per case: i, b, lmin, lmax, ltot, hkv,
    grp, d, max_len, splits / stages (as pinned; None: planned), plan ([splits, stages] launched), pdl /
    busy / kb (a k bias outside the cache), err, ok. Stops early at `deadline`."""
    on_cuda = torch.device(device).type == "cuda"
    rows = []
    for index, case in enumerate(cases, start):
        if deadline is not None and time.time() > deadline:
            break
        busy = on_cuda and busy_every > 0 and index % busy_every == busy_every - 1
        pdl = busy or index % 2 == 1
        with_bias = index % 4 == 1
        err, error = math.inf, None
        try:
            q, k_pool, v_pool, table, seq_lens = attention_inputs(case, index, seed, device)
            k_bias = k_bias_inputs(case, index, seed, device) if with_bias else None
            expected = ref.decode_attention(q, k_pool, v_pool, table, seq_lens, k_bias=k_bias)
            if busy:
                torch.cuda.synchronize()
                busy_gpu()
            out = attend(q, k_pool, v_pool, table, seq_lens, case.max_seq_len, case.num_splits, case.num_stages,
                         pdl, k_bias=k_bias)
            err = rel_err(out, expected)
            del q, k_pool, v_pool, table, seq_lens, expected, out, k_bias
        except Exception as exc:
            error = error_message(exc)
        plan = attention_plan(case, device)
        row = dict(i=index, b=case.batch, lmin=min(case.lens), lmax=max(case.lens), ltot=sum(case.lens),
                   hkv=case.hkv, grp=case.group, d=case.dim, max_len=case.max_seq_len, splits=case.num_splits,
                   stages=case.num_stages, plan=list(plan) if plan else None, pdl=pdl, busy=busy, kb=with_bias,
                   err=_err(err), ok=err < (K_BIAS_REL_TOL if with_bias else ATTENTION_REL_TOL))
        if error:
            row["error"] = error
        rows.append(row)
        if on_row:
            on_row(row)
    return rows
