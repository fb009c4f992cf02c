"""Seeded kernel fuzz on one GPU: every case checked against its reference, a subset timed against FP16.

    PYTHONPATH=. python bench/kernel_fuzz_h200.py --seed S --gemm-cases 2000 --attention-cases 500 \\
        [--timing-cases N] [--timing-seconds T] [--pdl-tests] [--routing-sweep] [--max-seconds T] --out $OUT

Cases: qoq/runtime_cuda/fuzz_shapes.py (seeded samplers and their caps), plus the pinned shapes where held-out
measurements found the kernels slower than FP16 (fuzz_shapes.PINNED_*), and for correctness only the GEMM shapes
an earlier run found wrong (fuzz_shapes.REGRESSION_GEMM_*; rows marked pinned like the others).
1. Correctness, every case (qoq/runtime_cuda/fuzz_check.py): CudaW4A8Linear (quantization kernel + auto GEMM,
   a programmatic dependent as always) against IntegerLinear from the same export_linear tensors (rel. error
   < 2e-3); decode_attention against attention_reference.decode_attention on the same KV4 pages (rel. error
   < 1e-3), pinned and planned split counts and ring depths, half the launches with enable_pdl; every 4th case
   behind ~2 ms of unrelated kernels and garbage-filled free memory.
2. Speed, a subset in order pinned shapes, one case of every shape class, then the rest at random, until
   --timing-cases per kernel or the --timing-seconds budget (55% GEMM, the rest attention) runs out. Through
   bench/timing.py's time_graph: one CUDA graph of back-to-back calls, each on its own input set, sets cycled
   past 256 MiB (weights, inputs and outputs counted; at most 128 GEMM / 256 attention sets, so the smallest
   shapes stay in L2 on both sides alike) so that weights and KV come from HBM; median of 40 replays.
   * GEMM class: (group, the kernel auto_variant picks, M bucket). CudaW4A8Linear.forward on fp16 tokens (its
     quantization kernel included), random weights per set, vs F.linear fp16 of the same [M, K] x [K, N]
     (weights cycled the same way). speedup = fp16_us / w4a8_us.
   * Attention class: (head dim, group, B bucket, split or not as planned). decode_attention as planned
     (num_splits / num_stages None, max_seq_len = max(lens), plain launch) over random KV4 pages, vs the
     fastest FP16 baseline measured of: (a) F.scaled_dot_product_attention over dense fp16 K/V [B, Hkv, Lmax,
     D] with enable_gqa, every sequence padded to the longest and NO mask (for a ragged batch that is a lower
     bound on the masked SDPA's time: the mask only adds work and takes SDPA off its flash kernel; for equal
     lengths it is the exact SDPA baseline of bench/attention_h200.py); (b) the same with K/V expanded to
     every query head (where that takes <= 1 GiB a set; bench/attention_h200.py takes it too); (c) torch's
     flash-attention varlen kernel over packed fp16 K/V [sum(lens), Hkv, D] (ragged without padding; the
     kernel SDPA's flash backend runs). speedup = min(baselines) / kv4_us.
3. --pdl-tests: `pytest tests/runtime_cuda/test_pdl_sequences.py` in a subprocess (junit counts).
4. --routing-sweep: at the hidden sizes of 1-2B models (N, K in {1536, 2048}) and M >= 97, every GEMM
   variant that takes the shape (gemm.VARIANTS), launched as CudaW4A8Linear launches the auto pick
   (quantization kernel ahead, enable_pdl; bench/gemm_h200.py's w4a8_calls), the auto pick also without its
   quantization kernel, next to F.linear fp16: data for choosing gemm.Routing there. The Routing table was
   fit to Llama-2-7B shapes (N, K >= 4096); at N, K <= 2048 every M from 97 to 512 falls through
   _wgmma_variant to its last branch, wg64x64k2 (fewer than one wave of 128x64 tiles, M > wg_half_empty_m),
   a regime its sweep never timed. With --routing-from JSON, the same over the --routing-count slowest timed
   GEMM cases of that earlier run instead (the GEMVs too where M <= 64).
Sanitizers run as a separate command on a small run (see SANITIZER_NOTE); --sanitizer-logs TOOL=PATH folds their
"ERROR SUMMARY" counts in.

Writes --out/kernel_fuzz_h200.json incrementally (summary on top, rows one per line). --max-seconds bounds the
whole run after the build: correctness first, then timing, routing sweep, PDL tests with what is left.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import n_sets, time_graph  # noqa: E402
from qoq.runtime_cuda import fuzz_shapes as fs  # noqa: E402
from qoq.runtime_cuda.fuzz_check import check_attention_cases, check_gemm_cases, error_message  # noqa: E402

DEV = "cuda"
MAX_GEMM_SETS = 128  # below 2 MiB a set (N*K < ~2^22) the sets stay in L2, for W4A8 and FP16 alike
MAX_ATTENTION_SETS = 256
REPS = 40
EXPANDED_MAX_BYTES = 1 << 30
PDL_TESTS_RESERVE_S = 120.0  # kept free for --pdl-tests at the end
ROUTING_NK = ((1536, 1536), (2048, 1536), (1536, 2048), (2048, 2048))
ROUTING_M = (97, 128, 256, 512, 1024)
ROUTING_GROUPS = (128, -1)
SANITIZER_NOTE = (
    "compute-sanitizer runs as a separate command, on a small run without CUDA graphs or busy work: "
    "for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t --log-file $OUT/$t.log "
    "python bench/kernel_fuzz_h200.py --seed S --gemm-cases 40 --attention-cases 20 --timing-cases 0 "
    "--busy-every 0 --no-pinned --max-weight-elems 4194304 --out $OUT/san_$t; done; then pass --sanitizer-logs "
    "memcheck=$OUT/memcheck.log ... to the main run (or re-summarize).")


# -- GEMM timing ---------------------------------------------------------------------------------------

def random_linear(n: int, k: int, group: int, device=DEV):
    """A CudaW4A8Linear of random bytes (timing only: the values do not change the kernels' work)."""
    from qoq.runtime_cuda.linear import CudaW4A8Linear

    qweight = torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, device=device)
    s1 = (torch.rand(n, device=device) / 64).half()
    if group == -1:
        return CudaW4A8Linear(qweight, s1, s1_szeros=torch.rand(n, device=device).half())
    s2 = torch.randint(1, 17, (k // group, n), dtype=torch.int8, device=device)
    zeros = -torch.randint(0, 100, (k // group, n), dtype=torch.int8, device=device)
    return CudaW4A8Linear(qweight, s1, s2_scales=s2, s2_zeros=zeros)


def w4a8_call(case: fs.GemmCase, device=DEV):
    """CudaW4A8Linear.forward (its quantization kernel, then the GEMM) on one fresh weight and input set."""
    lin, x = random_linear(case.n, case.k, case.group, device), torch.randn(case.m, case.k, device=device).half()
    return lambda: lin(x)


def fp16_call(case: fs.GemmCase, device=DEV):
    w = torch.randn(case.n, case.k, device=device).half()
    x = torch.randn(case.m, case.k, device=device).half()
    return lambda: F.linear(x, w)


def time_gemm(case: fs.GemmCase) -> dict:
    m, n, k = case.m, case.n, case.k
    sets = n_sets(n * k // 2 + 2 * m * k + 2 * m * n, MAX_GEMM_SETS)
    w4a8_us = time_graph([w4a8_call(case) for _ in range(sets)], REPS)
    fp16_sets = n_sets(2 * n * k + 2 * m * k + 2 * m * n, MAX_GEMM_SETS)
    fp16_us = time_graph([fp16_call(case) for _ in range(fp16_sets)], REPS)
    return dict(w4a8_us=round(w4a8_us, 3), fp16_us=round(fp16_us, 3), speedup=round(fp16_us / w4a8_us, 4),
                sets=[sets, fp16_sets])


def gemm_class(case: fs.GemmCase, sms: int, hopper: bool) -> tuple:
    from qoq.runtime_cuda.gemm import auto_variant

    return case.group, auto_variant(case.m, case.n, case.k, case.group, sms, hopper, pdl=True), fs.m_bucket(case.m)


# -- attention timing ----------------------------------------------------------------------------------

def random_pool(num_pages: int, hkv: int, dim: int, device=DEV) -> torch.Tensor:
    """Random codes with sane fp16 scales and zeros (bench/attention_h200.py's)."""
    from qoq.runtime_cuda import attention_reference as ref

    pool = torch.randint(0, 256, (num_pages, ref.page_bytes(hkv, dim)), dtype=torch.uint8, device=device)
    _, scale, zero = ref.page_views(pool, hkv, dim)
    scale.copy_(torch.rand_like(scale, dtype=torch.float32).mul(0.2).add(0.01).half())
    zero.copy_(torch.rand_like(zero, dtype=torch.float32).mul(15).half())
    return pool


def kv4_set(case: fs.AttentionCase, device=DEV) -> tuple:
    """(q, k_pool, v_pool, page_table, seq_lens) of random KV4 pages, each sequence's pages at random ids."""
    from qoq.runtime_cuda import attention_reference as ref

    pages = [math.ceil(x / ref.PAGE_TOKENS) for x in case.lens]
    rows = torch.repeat_interleave(torch.arange(case.batch), torch.tensor(pages)).to(device)
    cols = torch.cat([torch.arange(p) for p in pages]).to(device)
    table = torch.zeros(case.batch, max(pages), dtype=torch.int32, device=device)
    table[rows, cols] = torch.randperm(sum(pages), device=device).int()
    q = torch.randn(case.batch, case.hkv * case.group, case.dim, device=device).half()
    pools = [random_pool(sum(pages), case.hkv, case.dim, device) for _ in range(2)]
    return q, *pools, table, torch.tensor(case.lens, dtype=torch.int32, device=device)


def kv4_call(case: fs.AttentionCase, device=DEV):
    """decode_attention as planned (plain launch, max_seq_len = the longest length) on one fresh set."""
    from qoq.runtime_cuda import attention

    q, kp, vp, table, seq_lens = kv4_set(case, device)
    return lambda: attention.decode_attention(q, kp, vp, table, seq_lens, max(case.lens))


def dense_call(case: fs.AttentionCase, expand: bool, device=DEV):
    """SDPA of q [B, Hq, 1, D] over dense fp16 K/V [B, Hkv, Lmax, D] (enable_gqa), or over K/V expanded to
    [B, Hq, Lmax, D]: every sequence padded to the longest, no mask (module docstring)."""
    b, hkv, d, lmax = case.batch, case.hkv, case.dim, max(case.lens)
    hq = hkv * case.group
    q = torch.randn(b, hq, 1, d, device=device).half()
    k, v = (torch.randn(b, hkv, lmax, d, device=device).half() for _ in range(2))
    if expand:
        k, v = k.repeat_interleave(case.group, 1), v.repeat_interleave(case.group, 1)
        return lambda: F.scaled_dot_product_attention(q, k, v)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)


def varlen_call(case: fs.AttentionCase, device=DEV):
    """torch's flash-attention varlen kernel: q [B, Hq, D] (one token a sequence) over packed fp16 K/V
    [sum(lens), Hkv, D], GQA native."""
    b, hkv, d = case.batch, case.hkv, case.dim
    q = torch.randn(b, hkv * case.group, d, device=device).half()
    k, v = (torch.randn(sum(case.lens), hkv, d, device=device).half() for _ in range(2))
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(case.lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    lmax = max(case.lens)
    return lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 1, lmax, 0.0, False, False)[0]


def _graph_us(make_call, per_set_bytes: int) -> float:
    return time_graph([make_call() for _ in range(n_sets(per_set_bytes, MAX_ATTENTION_SETS))], REPS)


def time_attention(case: fs.AttentionCase) -> dict:
    from qoq.runtime_cuda import attention_reference as ref

    b, hkv, d, lmax = case.batch, case.hkv, case.dim, max(case.lens)
    kv4_bytes = 2 * sum(math.ceil(x / ref.PAGE_TOKENS) for x in case.lens) * ref.page_bytes(hkv, d)
    result: dict = dict(kv4_us=round(_graph_us(lambda: kv4_call(case), kv4_bytes), 3))
    dense_bytes = 2 * b * hkv * lmax * d * 2
    options = [("sdpa_padded", lambda: _graph_us(lambda: dense_call(case, False), dense_bytes))]
    if case.group > 1 and dense_bytes * case.group <= EXPANDED_MAX_BYTES:
        expanded_bytes = dense_bytes * case.group
        options.append(("sdpa_expanded", lambda: _graph_us(lambda: dense_call(case, True), expanded_bytes)))
    options.append(("flash_varlen", lambda: _graph_us(lambda: varlen_call(case), 2 * sum(case.lens) * hkv * d * 2)))
    baselines, errors = {}, {}
    for name, timed in options:
        try:
            baselines[name] = round(timed(), 3)
        except Exception as exc:  # an unsupported baseline is recorded, not fatal
            errors[name] = error_message(exc)
            torch.cuda.synchronize()
    result["fp16"] = baselines
    if errors:
        result["fp16_errors"] = errors
    if baselines:
        result["fp16_us"] = min(baselines.values())
        result["fp16_best"] = min(baselines, key=baselines.get)
        result["speedup"] = round(result["fp16_us"] / result["kv4_us"], 4)
    return result


def attention_class(case: fs.AttentionCase, sms: int) -> tuple:
    from qoq.runtime_cuda.attention import split_plan

    split = split_plan(case.batch, case.hkv, max(case.lens), sms)[0] > 1
    return case.dim, case.group, fs.batch_bucket(case.batch), split


# -- routing sweep -------------------------------------------------------------------------------------

def routing_grid() -> list[tuple[int, int, int, int]]:
    """(M, N, K, group) at the hidden sizes of 1-2B models."""
    return [(m, n, k, g) for g in ROUTING_GROUPS for n, k in ROUTING_NK for m in ROUTING_M]


def slowest_shapes(path: Path, count: int) -> list[tuple[int, int, int, int]]:
    """(M, N, K, group) of the `count` timed GEMM cases of an earlier run with the lowest speedup vs FP16."""
    rows = [r for r in json.loads(path.read_text())["gemm_timing"] if "speedup" in r]
    return [(r["m"], r["n"], r["k"], r["g"]) for r in sorted(rows, key=lambda r: r["speedup"])[:count]]


def routing_sweep(deadline: float, on_row, shapes: list[tuple[int, int, int, int]]) -> list[dict]:
    from bench.gemm_h200 import baseline_calls, w4a8_calls
    from qoq.runtime_cuda.gemm import GEMV_GROUPS, GEMV_MAX_M, VARIANTS, auto_variant, is_hopper

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hopper = is_hopper(torch.device(DEV))
    rows = []
    for m, n, k, group in shapes:
        if time.time() > deadline:
            return rows
        row = dict(n=n, k=k, m=m, g=group, auto=auto_variant(m, n, k, group, sms, hopper, pdl=True))
        row["fp16_us"] = round(time_graph(baseline_calls("fp16", m, n, k)[0], REPS), 3)
        times = {}
        for variant in VARIANTS:
            if variant.startswith("gemv") and (m > GEMV_MAX_M or group not in GEMV_GROUPS):
                continue
            if variant.startswith("wg") and not hopper:
                continue
            try:
                times[variant] = round(time_graph(w4a8_calls(m, n, k, group, variant, enable_pdl=True,
                                                             quantize=True), REPS), 3)
            except Exception as exc:
                row.setdefault("errors", {})[variant] = error_message(exc)
        row["us"] = times
        try:  # the auto pick without its quantization kernel: what the quantization costs here
            row["auto_gemm_only_us"] = round(time_graph(w4a8_calls(m, n, k, group, row["auto"],
                                                                   enable_pdl=True), REPS), 3)
        except Exception as exc:
            row.setdefault("errors", {})["auto_gemm_only"] = error_message(exc)
        if times:
            best = min(times, key=times.get)
            row.update(best=best, best_speedup=round(row["fp16_us"] / times[best], 4),
                       auto_speedup=round(row["fp16_us"] / times[row["auto"]], 4) if row["auto"] in times
                       else None)
        rows.append(row)
        on_row(row)
    return rows


# -- PDL tests, sanitizer logs -------------------------------------------------------------------------

def run_pdl_tests(timeout: float) -> dict:
    """pytest tests/runtime_cuda/test_pdl_sequences.py in a subprocess -> counts from its junit XML."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/runtime_cuda/test_pdl_sequences.py", f"--junitxml={xml}"]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
        except subprocess.TimeoutExpired:
            return dict(ran=False, note=f"timed out after {timeout:.0f} s")
        counts = junit_counts(xml.read_text()) if xml.exists() else None
        return dict(ran=counts is not None, returncode=proc.returncode, seconds=round(time.time() - t0, 1),
                    **(counts or {}), tail=(proc.stdout + proc.stderr)[-1500:])


def junit_counts(xml_text: str) -> dict:
    """tests / failures / errors / skipped summed over a junit XML's test suites."""
    root = ET.fromstring(xml_text)
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    return {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}


def sanitizer_record(specs: list[str]) -> dict:
    """TOOL=PATH specs -> {tools, per_tool error counts, errors: their sum (None if a log has no summary)}."""
    counts = {}
    for spec in specs:
        tool, _, log = spec.partition("=")
        counts[tool] = sanitizer_errors(Path(log).read_text(errors="replace"))
    return dict(tools=list(counts), per_tool=counts, errors=None if None in counts.values() else sum(counts.values()))


def sanitizer_errors(log_text: str) -> int | None:
    """The error count of a compute-sanitizer log's last "ERROR SUMMARY: N error(s)" line (None if absent)."""
    found = re.findall(r"ERROR SUMMARY:\s*(\d+)\s+error", log_text)
    return int(found[-1]) if found else None


# -- results -------------------------------------------------------------------------------------------

def summarize(result: dict) -> dict:
    checks = result["gemm_checks"] + result["attention_checks"]
    gemm_t = [r for r in result["gemm_timing"] if "speedup" in r]
    attn_t = [r for r in result["attention_timing"] if "speedup" in r]
    gd = fs.distribution([r["speedup"] for r in gemm_t])
    ad = fs.distribution([r["speedup"] for r in attn_t])
    pdl = result.get("pdl_tests")
    san = result.get("sanitizer")
    summary = dict(
        gpu=result["gpu"], seed=result["seed"],
        gemm_cases=len(result["gemm_checks"]), attention_cases=len(result["attention_checks"]),
        gemm_fuzz_cases=sum(not r.get("pinned") for r in result["gemm_checks"]),
        attention_fuzz_cases=sum(not r.get("pinned") for r in result["attention_checks"]),
        failures=sum(not r["ok"] for r in checks),
        sanitizer_errors=san["errors"] if san else None,
        sanitizer_tools=san["tools"] if san else [],
        pdl_sequence_failures=(pdl["failures"] + pdl["errors"]) if pdl and pdl.get("ran")
        and pdl.get("tests", 0) > pdl.get("skipped", 0) else None,  # None: not run, or every test skipped (not Hopper)
        min_speedup_vs_fp16_gemm=gd and gd["min"], p10_speedup_vs_fp16_gemm=gd and gd["p10"],
        median_speedup_vs_fp16_gemm=gd and gd["median"],
        min_speedup_vs_sdpa_attention=ad and ad["min"], p10_speedup_vs_sdpa_attention=ad and ad["p10"],
        median_speedup_vs_sdpa_attention=ad and ad["median"],
        gemm_timings=len(gemm_t), attention_timings=len(attn_t),
        gemm_below_fp16=gd and gd["below_1"], attention_below_sdpa=ad and ad["below_1"],
        timing_errors=sum("error" in r for r in result["gemm_timing"] + result["attention_timing"]),
        timing_coverage=result.get("timing_coverage"),
        complete=result.get("complete", False), command=result["command"],
    )
    if san is None:
        summary["sanitizer_note"] = SANITIZER_NOTE
    return summary


def distributions(result: dict) -> dict:
    out = {}
    for kernel, key in (("gemm", "gemm_timing"), ("attention", "attention_timing")):
        rows = [r for r in result[key] if "speedup" in r]
        out[kernel] = dict(all=fs.distribution([r["speedup"] for r in rows]),
                           fuzz=fs.distribution([r["speedup"] for r in rows if not r.get("pinned")]),
                           pinned=fs.distribution([r["speedup"] for r in rows if r.get("pinned")]))
    gemm = [r for r in result["gemm_timing"] if "speedup" in r]
    out["gemm_by_group"] = {str(g): fs.distribution([r["speedup"] for r in gemm if r["g"] == g])
                            for g in fs.GEMM_GROUPS}
    out["gemm_by_m"] = {b: fs.distribution([r["speedup"] for r in gemm if fs.m_bucket(r["m"]) == b])
                        for b in ("1", "2-16", "17-64", "65-256", "257-1024", "1025-4096")}
    attn = [r for r in result["attention_timing"] if "speedup" in r]
    out["attention_by_batch"] = {b: fs.distribution([r["speedup"] for r in attn if fs.batch_bucket(r["b"]) == b])
                                 for b in ("1", "2-8", "9-32", "33-128", "129-256")}
    out["attention_by_group"] = {str(g): fs.distribution([r["speedup"] for r in attn if r["grp"] == g])
                                 for g in range(1, 9)}
    return out


def worst(rows: list[dict], n: int = 20) -> list[dict]:
    return sorted((r for r in rows if "speedup" in r), key=lambda r: r["speedup"])[:n]


def dump(result: dict, path: Path) -> None:
    """JSON with the summary on top and every list of row dicts one row per line (compact, diffable)."""
    result = {"summary": summarize(result), "distributions": distributions(result),
              "worst_gemm": worst(result["gemm_timing"]), "worst_attention": worst(result["attention_timing"]),
              **{k: v for k, v in result.items() if k not in ("summary", "distributions")}}
    parts = []
    for key, value in result.items():
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            body = ",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in value)
            parts.append(f"{json.dumps(key)}: [\n{body}\n ]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value, indent=1)}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("{\n " + ",\n ".join(parts) + "\n}\n")
    tmp.replace(path)


def command_line(argv: list[str], out: Path) -> str:
    return "PYTHONPATH=. python bench/kernel_fuzz_h200.py " + " ".join("$OUT" if a == str(out) else a for a in argv)


# -- main ----------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int)
    ap.add_argument("--gemm-cases", type=int, default=2000)
    ap.add_argument("--attention-cases", type=int, default=500)
    ap.add_argument("--timing-cases", type=int, default=400, help="most timings per kernel (0: no timing)")
    ap.add_argument("--timing-seconds", type=float, default=150.0, help="budget of the timing phase")
    ap.add_argument("--busy-every", type=int, default=4, help="every Nth case behind busy work (0: none)")
    ap.add_argument("--max-weight-elems", type=int, default=fs.MAX_NK, help="N*K cap of the GEMM sampler")
    ap.add_argument("--no-pinned", action="store_true", help="leave out fuzz_shapes' pinned and regression shapes")
    ap.add_argument("--pdl-tests", action="store_true", help="run tests/runtime_cuda/test_pdl_sequences.py too")
    ap.add_argument("--routing-sweep", action="store_true", help="time every GEMM variant at 1-2B hidden sizes")
    ap.add_argument("--routing-seconds", type=float, default=60.0)
    ap.add_argument("--routing-from", type=Path, metavar="JSON",
                    help="sweep the slowest timed GEMM cases of this earlier run instead of the 1-2B grid")
    ap.add_argument("--routing-count", type=int, default=40, help="how many of them (--routing-from)")
    ap.add_argument("--sanitizer-logs", nargs="*", default=[], metavar="TOOL=PATH",
                    help="compute-sanitizer logs whose ERROR SUMMARY counts go into the summary")
    ap.add_argument("--resummarize", type=Path, metavar="JSON",
                    help="only recompute the summary of a results file (folding in --sanitizer-logs); no GPU")
    ap.add_argument("--max-seconds", type=float, default=540.0,
                    help="bound on the whole run, build included (the device runs a command for 600 s at most)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    sanitizer = sanitizer_record(args.sanitizer_logs) if args.sanitizer_logs else None
    if args.resummarize:
        result = json.loads(args.resummarize.read_text())
        derived = ("summary", "distributions", "worst_gemm", "worst_attention")
        result = {k: v for k, v in result.items() if k not in derived}
        if sanitizer:
            result["sanitizer"] = sanitizer
        dump(result, args.resummarize)
        print(json.dumps(summarize(result), indent=1))
        return
    if args.seed is None or args.out is None:
        ap.error("--seed and --out are required (unless --resummarize)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "kernel_fuzz_h200.json"

    from qoq.runtime_cuda import attention, gemm

    t0 = time.time()
    deadline = t0 + args.max_seconds
    gemm.extension()
    attention.extension()
    build_s = time.time() - t0
    print(f"build {build_s:.1f} s", flush=True)
    start = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hopper = gemm.is_hopper(torch.device(DEV))
    result = dict(gpu=torch.cuda.get_device_name(), seed=args.seed, command=command_line(argv, args.out),
                  torch=torch.__version__, multiprocessors=sms, hopper=hopper, build_s=round(build_s, 1),
                  complete=False, notes=[__doc__], gemm_checks=[], attention_checks=[], gemm_timing=[],
                  attention_timing=[])
    if sanitizer:
        result["sanitizer"] = sanitizer
    dump(result, path)

    # 1. correctness
    gemm_list = fs.gemm_cases(args.seed, args.gemm_cases, max_nk=args.max_weight_elems)
    attn_list = fs.attention_cases(args.seed, args.attention_cases)
    pinned_gemm = [] if args.no_pinned else fs.pinned_gemm_cases()
    pinned_attn = [] if args.no_pinned else fs.pinned_attention_cases()
    gemm_all, attn_all = gemm_list + pinned_gemm, attn_list + pinned_attn
    gemm_checked = gemm_all + ([] if args.no_pinned else fs.regression_gemm_cases())  # these last: not timed

    def progress(kind: str, rows: list, total: int, fuzz: int):
        def on_row(row: dict) -> None:
            row["pinned"] = row["i"] >= fuzz
            rows.append(row)
            if not row["ok"]:
                print(f"FAIL {kind} {row}", flush=True)
            if len(rows) % 100 == 0 or len(rows) == total:
                bad = sum(not r["ok"] for r in rows)
                print(f"{kind} checks {len(rows)}/{total}, {bad} failed, {time.time() - start:.0f} s", flush=True)
                dump(result, path)
        return on_row

    checks_end = deadline - (PDL_TESTS_RESERVE_S if args.pdl_tests else 0.0)
    check_gemm_cases(gemm_checked, args.seed, DEV, busy_every=args.busy_every, deadline=checks_end,
                     on_row=progress("gemm", result["gemm_checks"], len(gemm_checked), len(gemm_list)))
    check_attention_cases(attn_all, args.seed, DEV, busy_every=args.busy_every, deadline=checks_end,
                          on_row=progress("attention", result["attention_checks"], len(attn_all), len(attn_list)))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    dump(result, path)

    # 2. speed
    checked_all = (len(result["gemm_checks"]) == len(gemm_checked) and len(result["attention_checks"]) == len(attn_all))
    reserve = (PDL_TESTS_RESERVE_S if args.pdl_tests else 0.0) + (args.routing_seconds if args.routing_sweep else 0.0)
    timing_end = min(time.time() + args.timing_seconds, deadline - reserve)
    gemm_classes = [gemm_class(c, sms, hopper) for c in gemm_all]
    attn_classes = [attention_class(c, sms) for c in attn_all]
    if args.timing_cases > 0:
        gemm_end = time.time() + 0.55 * max(0.0, timing_end - time.time())
        order = fs.timing_order(len(gemm_all), lambda i: gemm_classes[i], args.seed,
                                first=range(len(gemm_list), len(gemm_all)))
        for i in order[: args.timing_cases]:
            if time.time() > gemm_end:
                break
            c = gemm_all[i]
            row = dict(i=i, m=c.m, n=c.n, k=c.k, g=c.group, pinned=i >= len(gemm_list), variant=gemm_classes[i][1])
            try:
                row.update(time_gemm(c))
            except Exception as exc:
                row["error"] = error_message(exc)
            result["gemm_timing"].append(row)
            print(f"gemm time {len(result['gemm_timing'])}: M={c.m} N={c.n} K={c.k} g={c.group} {row['variant']} "
                  f"{row.get('w4a8_us')} vs fp16 {row.get('fp16_us')} us -> x{row.get('speedup')}"
                  + (f" ERROR {row['error']}" if "error" in row else ""), flush=True)
            if len(result["gemm_timing"]) % 20 == 0:
                dump(result, path)
        torch.cuda.empty_cache()
        dump(result, path)
        order = fs.timing_order(len(attn_all), lambda i: attn_classes[i], args.seed,
                                first=range(len(attn_list), len(attn_all)))
        for i in order[: args.timing_cases]:
            if time.time() > timing_end:
                break
            c = attn_all[i]
            splits = attention.split_plan(c.batch, c.hkv, max(c.lens), sms)[0]
            row = dict(i=i, b=c.batch, lmin=min(c.lens), lmax=max(c.lens), ltot=sum(c.lens), hkv=c.hkv, grp=c.group,
                       d=c.dim, splits=splits, stages=attention.plan_stages(c.batch, c.hkv, splits, c.dim, sms),
                       pinned=i >= len(attn_list))
            try:
                row.update(time_attention(c))
            except Exception as exc:
                row["error"] = error_message(exc)
            result["attention_timing"].append(row)
            print(f"attention time {len(result['attention_timing'])}: B={c.batch} L={row['lmin']}..{row['lmax']} "
                  f"Hkv={c.hkv} G={c.group} D={c.dim} {row.get('kv4_us')} vs fp16 {row.get('fp16_us')} us "
                  f"({row.get('fp16_best')}) -> x{row.get('speedup')}"
                  + (f" ERROR {row['error']}" if "error" in row else ""), flush=True)
            if len(result["attention_timing"]) % 20 == 0:
                dump(result, path)
            torch.cuda.empty_cache()
        dump(result, path)

    result["timing_coverage"] = dict(
        gemm_classes=len(set(gemm_classes)),
        gemm_classes_timed=len({gemm_classes[r["i"]] for r in result["gemm_timing"] if "speedup" in r}),
        attention_classes=len(set(attn_classes)),
        attention_classes_timed=len({attn_classes[r["i"]] for r in result["attention_timing"] if "speedup" in r}),
        gemm_class="(group, auto_variant pick, M bucket)", attention_class="(head dim, group, B bucket, split)")
    dump(result, path)

    # 3. routing sweep, 4. PDL tests
    if args.routing_sweep:
        result["routing_sweep"] = []
        sweep_end = min(time.time() + args.routing_seconds, deadline - (PDL_TESTS_RESERVE_S if args.pdl_tests else 0.0))

        def on_sweep(row):
            result["routing_sweep"].append(row)
            print(f"routing N={row['n']} K={row['k']} M={row['m']} g={row['g']}: fp16 {row['fp16_us']} us, "
                  f"best {row.get('best')} x{row.get('best_speedup')}, auto {row['auto']} x{row.get('auto_speedup')}",
                  flush=True)
            dump(result, path)

        shapes = slowest_shapes(args.routing_from, args.routing_count) if args.routing_from else routing_grid()
        routing_sweep(sweep_end, on_sweep, shapes)
    if args.pdl_tests:
        left = deadline - time.time()
        result["pdl_tests"] = run_pdl_tests(left) if left > 20 else dict(ran=False, note="no time left")
        print(f"pdl tests: {({k: v for k, v in result['pdl_tests'].items() if k != 'tail'})}", flush=True)
    result["complete"] = checked_all
    result["elapsed_s"] = round(time.time() - t0, 1)
    dump(result, path)
    print(json.dumps(summarize(result), indent=1), flush=True)


if __name__ == "__main__":
    main()
