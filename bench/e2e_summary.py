"""Summary and plot of bench/e2e_h200.py's rows (also used by its --merge).

Summary keys are those of the first shape run (`model_shape`); `by_shape` holds every shape's.
max_throughput_tok_s_* are at the 48 GB budget (the headline target), *_full at the whole GPU.
A key whose rows are missing (format not run, skipped, failed, truncated by time) is null, with
the reason in `null_reasons`.
"""

from __future__ import annotations

from pathlib import Path

TARGETS = {"speedup_max_throughput_48gb": ">= 3.0", "speedup_max_throughput_full": ">= 2.0",
           "speedup_b1_decode": ">= 2.5", "host_overhead_fraction": "< 0.10"}
FORMATS = ("w4a8kv4", "fp16", "fp8")


def _value(rows: list[dict], key: str, **match) -> tuple[float | None, str | None]:
    hits = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    what = ", ".join(f"{k}={v}" for k, v in match.items())
    if not hits:
        failed = [r["error"] for r in rows if r.get("kind") == "load" and r.get("format") == match.get("format")]
        return None, f"{what}: " + (f"build or load failed: {failed[-1]}" if failed else "not run")
    row = hits[-1]
    for bad in ("error", "skipped"):
        if bad in row:
            return None, f"{what}: {bad}: {row[bad]}"
    if row.get("truncated"):
        return None, f"{what}: truncated by --max-seconds ({row.get(key)} over the part that ran)"
    if row.get(key) is None:
        return None, f"{what}: {row.get('host_overhead_reason', 'no value')}"
    return row[key], None


def shape_summary(rows: list[dict]) -> dict:
    s, why = {}, {}

    def put(name: str, value, reason=None):
        s[name] = value
        if value is None:
            why[name] = reason

    def ratio(name: str, a: str, b: str):
        put(name, s[a] / s[b] if s[a] is not None and s[b] else None,
            "; ".join(why[k] for k in (a, b) if k in why) or "zero baseline")

    for fmt in FORMATS:
        put(f"max_throughput_tok_s_{fmt}", *_value(rows, "output_tok_s", kind="max_throughput", format=fmt,
                                                   budget="48gb"))
        put(f"max_throughput_tok_s_{fmt}_full", *_value(rows, "output_tok_s", kind="max_throughput",
                                                        format=fmt, budget="full"))
        put(f"b1_decode_tok_s_{fmt}", *_value(rows, "decode_tok_s", kind="sweep", format=fmt, batch=1))
        put(f"ttft_ms_{fmt}", *_value(rows, "ms", kind="ttft", format=fmt))
    ratio("speedup_max_throughput_48gb", "max_throughput_tok_s_w4a8kv4", "max_throughput_tok_s_fp16")
    ratio("speedup_max_throughput_full", "max_throughput_tok_s_w4a8kv4_full", "max_throughput_tok_s_fp16_full")
    ratio("speedup_b1_decode", "b1_decode_tok_s_w4a8kv4", "b1_decode_tok_s_fp16")
    # against FP8 W8A8 (the fp16 artifact quantized at load, as vLLM's --quantization fp8): the 48 GB budget
    # counts its e4m3 weight bytes, so it has more room for KV than FP16
    ratio("speedup_vs_fp8_max_throughput_48gb", "max_throughput_tok_s_w4a8kv4", "max_throughput_tok_s_fp8")
    ratio("speedup_vs_fp8_max_throughput_full", "max_throughput_tok_s_w4a8kv4_full", "max_throughput_tok_s_fp8_full")
    ratio("speedup_vs_fp8_b1_decode", "b1_decode_tok_s_w4a8kv4", "b1_decode_tok_s_fp8")
    put("fp16_b1_roofline_fraction", *_value(rows, "roofline_fraction", kind="sweep", format="fp16", batch=1))
    # the worst decode step of the sweep: host overhead weighs most where the GPU work is smallest
    overheads = [r["host_overhead_fraction"] for r in rows if r.get("kind") == "sweep"
                 and r.get("format") == "w4a8kv4" and r.get("host_overhead_fraction") is not None]
    put("host_overhead_fraction", max(overheads) if overheads else None,
        "no W4A8KV4 sweep row with a graph timing (reference backend, or the sweep did not run)")
    s["null_reasons"] = why
    s["oom_retries"] = [f"{r['format']} {r['budget']}: {r['requests']} requests, not {r['oom_retry_from']}"
                        for r in rows if "oom_retry_from" in r]
    return s


def summarize(result: dict) -> dict:
    rows = result.get("rows", [])
    shapes = list(dict.fromkeys(r["shape"] for r in rows)) or list(result.get("shapes", []))
    by_shape = {shape: shape_summary([r for r in rows if r["shape"] == shape]) for shape in shapes}
    head = by_shape[shapes[0]] if shapes else shape_summary([])
    return {"gpu": result.get("gpu"), "model_shape": shapes[0] if shapes else None, **head, "targets": TARGETS,
            "command": result.get("command"), "by_shape": by_shape}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("kind") == "sweep" and "decode_tok_s" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in result["rows"]))
    fig, axes = plt.subplots(1, max(1, len(shapes)), figsize=(6.5 * max(1, len(shapes)), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for fmt in FORMATS:
            pts = sorted((r["batch"], r["decode_tok_s"]) for r in rows if r["shape"] == shape and r["format"] == fmt)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=fmt)
        ax.set(xscale="log", yscale="log", xlabel="batch (sequences decoding)", ylabel="decode tokens/s",
               title=f"{shape}, {result.get('plan', {}).get('prompt')}-token prompts")
        ax.legend()
    fig.suptitle(f"qoq engine decode throughput on {result.get('gpu')} (random weights)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
