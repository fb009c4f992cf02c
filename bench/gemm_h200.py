"""W4A8 GEMM + fused quantization kernels on one GPU: build, check, benchmark (one device call).

    python bench/gemm_h200.py --out $OUT

1. builds the extension (qoq/runtime_cuda/build.py) and times it;
2. speed on Llama-2-7B shapes vs torch fp16 F.linear, INT8 torch._int_mm, FP8 torch._scaled_mm:
   CUDA-graph replays over rotating input sets (> 3x L2, so weights come from HBM), median of 40;
   the W4A8 GEMMs launched as CudaW4A8Linear launches them (on Hopper each is a programmatic
   dependent, starting while the one ahead of it ends), auto_variant's pick also plainly ("auto_no_pdl");
3. correctness (after the timings, so a timeout cuts checks rather than numbers): every M x (N, K)
   of four models, per group and per channel, every kernel variant: int32 accumulators exact vs the
   integer reference, fp16 rel. error < 1e-3 (outputs poisoned first); fused quantizers: codes
   within ±1 in <= 0.1% of elements, scales and sums rel. error < 1e-3.
bench/executor_cuda_check.py's executor_check.json, if already in --out, is copied in.
Writes gemm_h200.json (summary on top) and gemm_h200.png under --out. `--resummarize JSON` recomputes
the "auto" rows (after a change to qoq.runtime_cuda.gemm.auto_variant), the summary and the plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import n_sets, time_graph  # noqa: E402
from qoq.quant.activations import codes_at_scale  # noqa: E402
from qoq.quant.linear import export_linear  # noqa: E402
from qoq.quant.weights import quantize_weight  # noqa: E402
from qoq.runtime_cuda import quant_kernels, reference  # noqa: E402
from qoq.runtime_cuda.gemm import (  # noqa: E402
    GEMV_MAX_M, GEMVP_MAX_M, TILED_VARIANTS, VARIANTS, auto_variant, extension, is_hopper, tiles_for,
    w4a8_accumulators, w4a8_gemm,
)

MODELS = {  # (N, K) of qkv, o, gate_up, down; group size of the per-group recipe
    "llama2-7b": ([(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)], 128),
    "llama3-8b": ([(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)], 128),
    "qwen2.5-7b": ([(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)], 128),
    "smollm2": ([(960, 576), (576, 576), (3072, 576), (576, 1536)], 64),
}
CHECK_M = [1, 7, 16, 33, 64, 128, 255, 512, 1024, 4096]
BENCH_M = [1, 16, 32, 64, 128, 256, 512, 1024, 2048]
MAX_SETS = 64  # input sets cycled per timing (bench/timing.py)
INT8_PEAK_TOPS = 1979.0  # H100/H200 SXM dense INT8 tensor-core datasheet rate
DEV = "cuda"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


SELECTED = list(VARIANTS)  # --variants narrows this (a tuning run)


def variants_for(m: int) -> list[str]:
    return [v for v in SELECTED if not v.startswith("gemv") or m <= (GEMVP_MAX_M if v == "gemv16p" else GEMV_MAX_M)]


def takes_tiles(variant: str, m: int, group: int) -> bool:
    """Whether `variant` ("auto": auto_variant's pick) gets its activations as A-fragment tiles, as a
    CudaW4A8Linear of m tokens quantizes them (gemm.tiles_for)."""
    return (variant in TILED_VARIANTS or variant == "auto") and tiles_for(m, group)


def bench_variants_for(m: int) -> list[str]:
    """Timed variants: at M <= 16 only the GEMVs (the MMA kernels were >= 2x slower there in every sweep)."""
    return [v for v in variants_for(m) if v.startswith("gemv")] if m <= 16 else variants_for(m)


def check_gemm(model: str, n: int, k: int, group: int) -> list[dict]:
    w = torch.randn(n, k, device=DEV)
    t = export_linear("w", quantize_weight(w, group), torch.randn(n, device=DEV).half())
    s2 = {a: t[f"w.{a}"] for a in ("s2_scales", "s2_zeros") if f"w.{a}" in t}
    w_int = reference.integer_weight(t["w.qweight"], **s2)  # [N, K], built once per weight
    rows = []
    for m in CHECK_M:
        x = torch.randn(m, k, device=DEV).half()
        qx, s_x, xsum = reference.reference_quant(x, sums="inputs")
        acc_ref = reference.accumulate(qx, w_int)
        per_channel = {"s1_szeros": t["w.s1_szeros"], "xsum": xsum} if group == -1 else {}
        y_ref = reference.epilogue(acc_ref, s_x, t["w.s1_scales"], bias=t["w.bias"], out_dtype=torch.float32,
                                   **per_channel)
        per_group = dict(s2, qsum=qx.sum(dim=1, dtype=torch.int32)) if s2 else {}  # as the quant kernels give it
        tiles = None
        if tiles_for(m, group):  # rows past M of the tiles hold garbage, which no kernel may store or mix in
            padded = torch.randint(-127, 128, (16, k), dtype=torch.int8, device=DEV)
            padded[:m] = qx
            tiles = reference.rows_to_tiles(padded)
        for variant in variants_for(m):
            for layout in ("rows", "tiles") if takes_tiles(variant, m, group) else ("rows",):
                a, rows_of = (tiles, {"m": m}) if layout == "tiles" else (qx, {})
                acc = torch.full((m, n), -(2**31), dtype=torch.int32, device=DEV)
                w4a8_accumulators(a, t["w.qweight"], out=acc, variant=variant, **per_group, **rows_of)
                y = torch.full((m, n), float("nan"), dtype=torch.float16, device=DEV)
                w4a8_gemm(a, s_x, t["w.qweight"], t["w.s1_scales"], bias=t["w.bias"], out=y, variant=variant,
                          **per_group, **per_channel)
                exact = torch.equal(acc.long(), acc_ref)
                err = rel_err(y, y_ref) if torch.isfinite(y).all() else float("inf")
                rows.append(dict(model=model, n=n, k=k, group=group, m=m, variant=variant, layout=layout,
                                 acc_exact=exact, rel_err=err, ok=exact and err < 1e-3))
    return rows


def sum_error(xs: torch.Tensor, xs_ref: torch.Tensor, q_ref: torch.Tensor, s_ref: torch.Tensor) -> float:
    """Largest per-token error of the input sums relative to the sum of the inputs' magnitudes (about
    sum |q| * s): a single sum that cancels towards zero has no meaningful relative error (a 1-token,
    K=14336 row once failed 1e-3 that way with codes, scale and code sums exact)."""
    abs_sum = q_ref.float().abs().sum(dim=-1).reshape(-1) * s_ref.float().reshape(-1)  # [tokens]
    return ((xs.double() - xs_ref.double()).abs().reshape(-1) / abs_sum.double()).max().item()


def code_stats(result, ref, y_ref, code_sums) -> dict:
    """result / ref: (qx, s_x, input sums); y_ref: the reference's fp16 input to the quantization;
    code_sums: (qx, s_x, code sums) of the kernel, exact to its codes.

    The fraction of codes that differ is judged at the kernel's own scales (y_ref quantized with them):
    when the kernel's fp32 math and torch's differ in the last bit, a token's largest fp16 input can round
    the other way, its scale then differs by an fp16 ulp and ~2% of that token's codes move by 1, which
    fails a 7-token row (13 codes of 4032 in one run) while every code is right for the scale it has. The
    scales are held to scale_rel_err; frac_code_diff (against the reference's own codes) is reported too."""
    (q, s, xs), (q_ref, s_ref, xs_ref) = result, ref
    diff = (q.int() - q_ref.int()).abs()
    q_at_s = codes_at_scale(y_ref, s)  # the reference's codes at the kernel's scales
    stats = dict(max_code_diff=int(diff.max()), frac_code_diff=(diff > 0).float().mean().item(),
                 frac_code_diff_at_kernel_scale=(q.float() != q_at_s).float().mean().item(),
                 scale_rel_err=rel_err(s, s_ref), sum_err_vs_abs_sum=sum_error(xs, xs_ref, q_ref, s_ref),
                 code_sums_exact=torch.equal(code_sums[2], code_sums[0].sum(dim=-1, dtype=torch.int32)))
    stats["ok"] = stats["max_code_diff"] <= 1 and stats["frac_code_diff_at_kernel_scale"] <= 1e-3 and max(
        stats["scale_rel_err"], stats["sum_err_vs_abs_sum"]) < 1e-3 and stats["code_sums_exact"]
    return stats


def check_fused() -> list[dict]:
    rows = []
    for tokens in (1, 7, 512, 4096):
        for k in (576, 1536, 3584, 4096, 11008, 14336, 18944):
            x = (torch.randn(tokens, k, device=DEV) * 3).half()
            gamma = (torch.rand(k, device=DEV) + 0.5).half()
            gate_up = (torch.randn(tokens, 2 * k, device=DEV) * 3).half()
            gate, up = gate_up[:, :k], gate_up[:, k:]
            cases = {  # kernel(sums), reference(sums), the reference's fp16 input to the quantization
                "quant": (lambda sums: quant_kernels.quant_tokens(x, sums),
                          lambda sums: reference.reference_quant(x, sums), x),
                "rmsnorm_quant": (lambda sums: quant_kernels.rmsnorm_quant(x, gamma, 1e-5, sums),
                                  lambda sums: reference.reference_rmsnorm_quant(x, gamma, 1e-5, sums),
                                  reference.rmsnorm_fp16(x, gamma, 1e-5)),
                "silu_mul_quant": (lambda sums: quant_kernels.silu_mul_quant(gate, up, sums),
                                   lambda sums: reference.reference_silu_mul_quant(gate, up, sums),
                                   reference.silu_mul_fp16(gate, up)),
            }
            for kernel, (run, ref, y_ref) in cases.items():
                stats = code_stats(run("inputs"), ref("inputs"), y_ref, run("codes"))
                rows.append(dict(kernel=kernel, tokens=tokens, k=k, **stats))
    return rows


def w4a8_calls(m, n, k, group, variant, enable_pdl=True, quantize=False):
    """One GEMM call per input set, launched as CudaW4A8Linear launches it (enable_pdl; activations as tiles
    where it quantizes them so: takes_tiles); `quantize`: each call first quantizes its fp16 tokens
    (quant_tokens, the kernel a linear runs just ahead)."""
    sets = n_sets(n * k // 2 + m * k, MAX_SETS)
    tiles = takes_tiles(variant, m, group)
    calls = []
    for _ in range(sets):
        qw = torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, device=DEV)
        qx = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=DEV)
        s_x, s1 = torch.rand(m, 1, device=DEV).half(), torch.rand(n, device=DEV).half() / 64
        if group == -1:
            extra = dict(s1_szeros=torch.rand(n, device=DEV).half(), xsum=torch.randn(m, device=DEV))
        else:  # the code sums come with qx from the quantization kernel, as xsum does per channel
            s2 = torch.randint(1, 17, (k // group, n), dtype=torch.int8, device=DEV)
            extra = dict(s2_scales=s2, s2_zeros=-torch.randint(0, 100, (k // group, n), dtype=torch.int8, device=DEV),
                         qsum=qx.sum(dim=1, dtype=torch.int32))
        if quantize:
            calls.append(lambda x=torch.randn(m, k, device=DEV).half(), qw=qw, s1=s1, e=extra:
                         _quantized_gemm(x, qw, s1, group, variant, enable_pdl, e, tiles))
        else:
            a = reference.rows_to_tiles(qx) if tiles else qx
            calls.append(lambda a=a, s_x=s_x, qw=qw, s1=s1, e=extra:
                         w4a8_gemm(a, s_x, qw, s1, variant=variant, enable_pdl=enable_pdl, **e))
    return calls


def _quantized_gemm(x, qw, s1, group, variant, enable_pdl, terms, tiles):
    qx, s_x, sums = quant_kernels.quant_tokens(x, sums="inputs" if group == -1 else "codes", tiles=tiles)
    terms = dict(terms, **({"xsum": sums} if group == -1 else {"qsum": sums}))
    return w4a8_gemm(qx, s_x, qw, s1, variant=variant, enable_pdl=enable_pdl, **terms)


def baseline_calls(kind, m, n, k):
    elem = 2 if kind == "fp16" else 1
    # cuBLASLt INT8 needs M > 16 and FP8 M % 16 == 0: smaller M run padded (noted in the record)
    m_run = max(m, 32) if kind == "int8" else (-(-m // 16) * 16 if kind == "fp8" else m)
    calls = []
    for _ in range(n_sets(n * k * elem + m_run * k * elem, MAX_SETS)):
        if kind == "fp16":
            x, w = torch.randn(m_run, k, device=DEV).half(), torch.randn(n, k, device=DEV).half()
            calls.append(lambda x=x, w=w: F.linear(x, w))
        elif kind == "int8":
            x = torch.randint(-127, 128, (m_run, k), dtype=torch.int8, device=DEV)
            w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=DEV)
            calls.append(lambda x=x, w=w: torch._int_mm(x, w.t()))
        else:
            x = torch.randn(m_run, k, device=DEV).to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn)
            one = torch.ones((), device=DEV)
            calls.append(lambda x=x, w=w, one=one: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one,
                                                                   out_dtype=torch.float16))
    return calls, m_run


def bench_shape(n, k, m, group, sms, hopper) -> list[dict]:
    """Every kernel variant, launched as CudaW4A8Linear launches them (programmatic dependents on Hopper);
    the "auto" rows are derived afterwards (with_auto). Row "auto_no_pdl": auto_variant's pick launched
    plainly, as a direct w4a8_gemm call without enable_pdl runs."""
    method = f"w4a8_{'pc' if group == -1 else 'g' + str(group)}"

    def row(variant, us, **extra):
        return dict(method=method, variant=variant, n=n, k=k, m=m, us=us, tops=2.0 * m * n * k / us / 1e6,
                    weight_tbps=n * k / 2 / us / 1e6, **extra)

    rows = [row(v, time_graph(w4a8_calls(m, n, k, group, v))) for v in bench_variants_for(m)]
    pick = auto_variant(m, n, k, group, sms, hopper)  # the plain launch's pick
    rows.append(row("auto_no_pdl", time_graph(w4a8_calls(m, n, k, group, pick, enable_pdl=False)), chosen=pick))
    return rows


def with_auto(bench: list[dict], multiprocessors: int, hopper: bool) -> list[dict]:
    """Add, for each w4a8 (method, shape, M), the row of the variant auto_variant picks."""
    rows = [r for r in bench if r.get("variant") != "auto"]
    for r in list(rows):
        if r["method"].startswith("w4a8") and r["variant"] != "auto_no_pdl":
            group = -1 if r["method"] == "w4a8_pc" else int(r["method"][6:])
            if r["variant"] == auto_variant(r["m"], r["n"], r["k"], group, multiprocessors, hopper, pdl=True):
                rows.append(dict(r, variant="auto", chosen=r["variant"]))
    return rows


def bench_baselines(n, k, m) -> list[dict]:
    rows = []
    for kind in ("fp16", "int8", "fp8"):
        try:
            calls, m_run = baseline_calls(kind, m, n, k)
            us = time_graph(calls)
        except RuntimeError as exc:  # an unsupported shape is recorded, not fatal
            rows.append(dict(method=kind, n=n, k=k, m=m, error=str(exc).splitlines()[0]))
            continue
        wbytes = n * k * (2 if kind == "fp16" else 1)
        rows.append(dict(method=kind, n=n, k=k, m=m, m_run=m_run, us=us, tops=2.0 * m * n * k / us / 1e6,
                         weight_tbps=wbytes / us / 1e6))
    return rows


def ceilings() -> dict:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    copy_us = time_graph([lambda: b.copy_(a)] * 4)
    x = torch.randint(-127, 128, (8192, 8192), dtype=torch.int8, device=DEV)
    mm_us = time_graph([lambda: torch._int_mm(x, x.t())] * 4)
    ones = [torch.zeros(1, device=DEV) for _ in range(8)]
    floor_us = time_graph([lambda t=t: t.add_(1) for t in ones])  # the least any kernel costs in this timing
    return dict(copy_tbps=2 * a.numel() / copy_us / 1e6, int_mm_8192_tops=2 * 8192**3 / mm_us / 1e6,
                kernel_floor_us=floor_us)


def speedups(bench: list[dict], method: str) -> dict:
    llama = MODELS["llama2-7b"][0]
    t = {(r["method"], r.get("variant", ""), r["n"], r["k"], r["m"]): r["us"] for r in bench if "us" in r}

    def ratio(base: str, ms: list[int], variant: str = "auto") -> float:
        vals = [t[(base, "", n, k, m)] / t[(method, variant, n, k, m)] for n, k in llama for m in ms
                if (base, "", n, k, m) in t and (method, variant, n, k, m) in t]
        return round(min(vals), 3) if vals else None

    return dict(min_speedup_vs_fp16_m_le_16=ratio("fp16", [1, 16]), speedup_vs_fp16_m256=ratio("fp16", [256]),
                speedup_vs_int8_m256=ratio("int8", [256]), min_speedup_vs_int8_m_ge_1024=ratio("int8", [1024, 2048]),
                speedup_vs_fp8_m2048=ratio("fp8", [2048]),
                min_speedup_vs_fp16_m_le_16_no_pdl=ratio("fp16", [1, 16], "auto_no_pdl"),
                speedup_vs_fp16_m256_no_pdl=ratio("fp16", [256], "auto_no_pdl"))


def plot(bench: list[dict], path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for ax, (n, k) in zip(axes, MODELS["llama2-7b"][0]):
        fp16 = {r["m"]: r["us"] for r in bench if r["method"] == "fp16" and r["n"] == n and r["k"] == k}
        for method in ("w4a8_g128", "w4a8_pc", "int8", "fp8"):
            pts = [(r["m"], fp16[r["m"]] / r["us"]) for r in bench if r["method"] == method and r["n"] == n
                   and r["k"] == k and r.get("variant", "auto") == "auto" and "us" in r]
            ax.plot(*zip(*pts), marker="o", label=method)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xscale="log", xlabel="M (tokens)", ylabel="speedup vs fp16 F.linear", title=f"N={n}, K={k}")
        ax.legend()
    fig.suptitle(f"W4A8 GEMM (g128 and per-channel, auto kernel choice) on {gpu}, Llama-2-7B shapes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--variants", help="comma-separated kernel variants to check and time (default: all)")
    parser.add_argument("--bench-m", help="comma-separated M values to time (default: %s)" % BENCH_M)
    parser.add_argument("--resummarize", type=Path, help="recompute auto rows and summary of a results JSON")
    parser.add_argument("--profile", nargs=5, metavar=("N", "K", "M", "GROUP", "VARIANT"),
                        help="only run one GEMM a few times (for ncu) and exit")
    args = parser.parse_args()
    if args.profile:
        n, k, m, group = map(int, args.profile[:4])
        for call in w4a8_calls(m, n, k, group, args.profile[4])[:3]:
            call()
        torch.cuda.synchronize()
        return
    if args.resummarize:
        result = json.loads(args.resummarize.read_text())
        meta = {k: v for k, v in result.items() if k not in ("summary", "bench", "correctness_gemm", "correctness_fused")}
        bench = with_auto(result["bench"], result["multiprocessors"], result["hopper"])
        save(args.resummarize.parent, meta, bench, result["correctness_gemm"], result["correctness_fused"],
             gpu=result["summary"]["gpu"])
        plot(bench, args.resummarize.with_suffix(".png"), result["summary"]["gpu"])
        print(json.dumps(json.loads(args.resummarize.read_text())["summary"], indent=1))
        return
    if args.out is None:
        parser.error("--out is required")
    if args.variants:
        unknown = set(args.variants.split(",")) - set(VARIANTS)
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
        SELECTED[:] = args.variants.split(",")
    bench_m = [int(m) for m in args.bench_m.split(",")] if args.bench_m else BENCH_M
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    extension()
    build_s = time.time() - t0
    print(f"build {build_s:.1f}s", flush=True)

    torch.cuda.empty_cache()

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hopper = is_hopper(torch.device(DEV))
    ceil = ceilings()
    print(f"ceilings {ceil}", flush=True)
    bench: list[dict] = []
    meta = dict(command="python bench/gemm_h200.py " + " ".join(
        "$OUT" if a == str(args.out) else a for a in sys.argv[1:]), torch=torch.__version__, build_s=round(build_s, 1),
                ceilings=ceil, multiprocessors=sms, hopper=hopper)
    executor_check = args.out / "executor_check.json"  # bench/executor_cuda_check.py, run before
    if executor_check.exists():
        meta["executor_check"] = json.loads(executor_check.read_text())
    gemm_rows, fused_rows = [], []
    save(args.out, meta, bench, gemm_rows, fused_rows)  # partial results survive a timeout
    for n, k in MODELS["llama2-7b"][0]:
        for m in bench_m:
            rows = bench_baselines(n, k, m) + bench_shape(n, k, m, 128, sms, hopper) + bench_shape(n, k, m, -1, sms, hopper)
            bench = with_auto(bench + rows, sms, hopper)
            torch.cuda.empty_cache()
            line = " ".join(f"{r['method']}{':' + r['variant'] if 'variant' in r else ''}={r['us']:.1f}"
                            for r in rows if "us" in r)
            print(f"N={n} K={k} M={m}: {line} (µs)", flush=True)
        save(args.out, meta, bench, gemm_rows, fused_rows)
    torch.cuda.empty_cache()
    if not args.skip_check:  # after the timings, so a timeout cuts checks, not numbers
        for model, (shapes, group) in MODELS.items():
            for n, k in shapes:
                for g in (group, -1):
                    rows = check_gemm(model, n, k, g)
                    gemm_rows += rows
                    bad = [r for r in rows if not r["ok"]]
                    print(f"check {model} N={n} K={k} g={g}: {len(rows) - len(bad)}/{len(rows)} ok"
                          + (f"  FIRST BAD {bad[0]}" if bad else ""), flush=True)
            save(args.out, meta, bench, gemm_rows, fused_rows)
        fused_rows = check_fused()
        bad = [r for r in fused_rows if not r["ok"]]
        print(f"fused: {len(fused_rows) - len(bad)}/{len(fused_rows)} ok" + (f" FIRST BAD {bad[0]}" if bad else ""))
        save(args.out, meta, bench, gemm_rows, fused_rows)
    try:
        plot(bench, args.out / "gemm_h200.png", torch.cuda.get_device_name())
    except ImportError as exc:
        print(f"no plot: {exc}")
    print(json.dumps(json.loads((args.out / "gemm_h200.json").read_text())["summary"], indent=1))


def save(out: Path, meta: dict, bench: list[dict], gemm_rows: list[dict], fused_rows: list[dict],
         gpu: str | None = None) -> None:
    w4a8 = [r["tops"] for r in bench if r["method"].startswith("w4a8")]
    best = max(w4a8, default=0.0)
    summary = dict(gpu=gpu or torch.cuda.get_device_name(), **speedups(bench, "w4a8_g128"),
                   **{f"{key}_pc": v for key, v in speedups(bench, "w4a8_pc").items()},
                   best_w4a8_tops=round(best, 1), best_w4a8_pct_of_int8_peak=round(100 * best / INT8_PEAK_TOPS, 1),
                   correctness_ok=all(r["ok"] for r in gemm_rows + fused_rows), checks=len(gemm_rows) + len(fused_rows))
    result = dict(summary=summary, **meta, bench=bench, correctness_gemm=gemm_rows, correctness_fused=fused_rows)
    (out / "gemm_h200.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
