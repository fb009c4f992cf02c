"""Summary and plot of bench/serve_h200.py's result: the max sustainable request rate per format (the highest
rate tried whose p99 TTFT met the SLO with no error), their ratio, errors and leaked KV pages."""

from __future__ import annotations

from pathlib import Path

FORMATS = ("w4a8kv4", "fp16")  # bench/e2e_h200.py's RECIPES: w4a8kv4g128 and fp16
TARGET_RATE_RATIO = 2.5  # the issue's target: W4A8KV4 sustains >= 2.5x FP16's max rate


def max_rate(fmt: dict) -> tuple[float | None, str | None]:
    """(rate, None) or (None, why)."""
    if fmt.get("error"):
        return None, f"the run failed: {fmt['error']}"
    runs = fmt.get("runs", [])
    if not runs:
        return None, "no rate was run (out of --total-seconds?)"
    passed = [r["rate"] for r in runs if r["sustainable"]]
    if not passed:
        return None, f"no rate met the SLO (lowest tried: {min(r['rate'] for r in runs)} req/s)"
    return max(passed), None


def summarize(result: dict) -> dict:
    s = {"gpu": result["gpu"], "slo_ttft_p99_s": result["slo_ttft_p99_s"], "workload": result.get("workload")}
    reasons = {}
    formats = result["formats"]
    runs = [r for f in formats.values() for r in [*f.get("runs", []), *([f["warmup"]] if "warmup" in f else [])]]
    # a 5xx the client saw is also in the server's count: the larger of the two per run
    s["errors"] = (sum(max(r["errors"], r.get("server_errors", 0)) for r in runs)
                   + sum(bool(f.get("error")) for f in formats.values()) + bool(result.get("error")))
    s["leaked_pages"] = sum(r.get("leaked_pages", 0) for r in runs)
    for name in FORMATS:
        fmt = formats.get(name)
        if fmt is None:
            why = "not asked (--formats)" if name not in result["formats_asked"] else result.get("error", "not run yet")
            rate = None
        else:
            rate, why = max_rate(fmt)
        s[f"max_rate_{name}"] = rate
        if why:
            reasons[f"max_rate_{name}"] = why
        elif all(r["sustainable"] for r in fmt["runs"]):
            s[f"max_rate_{name}_note"] = "every rate tried met the SLO: a lower bound (raise --rates)"
        row = next((r for r in fmt["runs"] if r["rate"] == rate), None) if rate is not None else None
        s[f"output_tok_s_at_max_{name}"] = row["output_tok_s"] if row else None
    w4, fp16 = s.get("max_rate_w4a8kv4"), s.get("max_rate_fp16")
    s["rate_ratio"] = round(w4 / fp16, 3) if w4 and fp16 else None
    if s["rate_ratio"] is None:
        reasons["rate_ratio"] = "needs both max rates"
    s["target_rate_ratio"] = TARGET_RATE_RATIO
    s["target_met"] = (s["rate_ratio"] >= TARGET_RATE_RATIO and s["errors"] == 0 and s["leaked_pages"] == 0
                       if s["rate_ratio"] is not None else None)
    s["command"] = result["command"]
    s["null_reasons"] = reasons
    return s


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, fmt in result["formats"].items():
        runs = sorted(fmt.get("runs", []), key=lambda r: r["rate"])
        if not runs:
            continue
        rates = [r["rate"] for r in runs]
        line, = ax_t.plot(rates, [r["ttft_p99_ms"] / 1000 for r in runs], "o-", label=name)
        bad = [r for r in runs if not r["sustainable"]]
        ax_t.plot([r["rate"] for r in bad], [r["ttft_p99_ms"] / 1000 for r in bad], "x", ms=10, color="k")
        ax_s.plot(rates, [r["output_tok_s"] for r in runs], "o-", color=line.get_color(), label=name)
    ax_t.axhline(result["slo_ttft_p99_s"], ls="--", color="grey", label=f"SLO {result['slo_ttft_p99_s']} s")
    ax_t.set(xlabel="request rate (req/s, Poisson)", ylabel="p99 TTFT (s)", yscale="log",
             title="time to first token (x: SLO missed)")
    ax_s.set(xlabel="request rate (req/s, Poisson)", ylabel="output tokens/s", title="output throughput")
    for ax in (ax_t, ax_s):
        ax.grid(alpha=0.3)
        ax.legend()
    w = result["workload"]
    fig.suptitle(f"qoq serve load test, {result['shape']} random weights, {result['gpu']}: prompts "
                 f"{w['input_len']}±{w['range_ratio']:.0%}, outputs {w['output_len']}±{w['range_ratio']:.0%} tokens",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
