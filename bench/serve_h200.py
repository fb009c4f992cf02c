"""Load test of `qoq serve`: W4A8KV4 (g128) against its FP16 twin, random-weight Llama-2-7B artifacts, H200.

    PYTHONPATH=. python bench/serve_h200.py --out $OUT      # both formats in --total-seconds (480)
    python bench/serve_h200.py --tiny --out DIR              # CPU smoke run of the same code

First, in a child process (so this one never holds GPU memory the servers' KV budget would miss): the CUDA
kernels are built and the artifacts built or reused (bench/e2e_h200.py's ensure_artifact, keyed by shape,
recipe, seed and device under --scratch; no tokenizer: prompts are token ids). Then per format, with an
equal share of the time left: `qoq serve ARTIFACT --backend cuda` as a subprocess, wait for /health, a
warm-up burst, then the rate search. Each run (bench/serve_load.py): Poisson arrivals for --duration s,
prompts and output lengths from the seeded workload (the same requests for both formats at a rate), what
still runs --drain s after the arrivals stop is cut; then /metrics must show the server idle with every KV
page free (the rest counts as leaked). A run is sustainable when no request failed and p99 TTFT <
--slo-ttft-p99 s. The search: the --rates grid ascending until a rate is not sustainable, then --refine
geometric bisections between the best sustainable rate and the first that was not (halving when the first
rate already fails); a run starts only if --duration + --drain fit in the format's share. The max
sustainable rate: the highest rate that passed. The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serve_load import Workload, burst, run_load, run_stats, schedule, settle  # noqa: E402
from bench.serve_summary import FORMATS, plot, summarize  # noqa: E402
from qoq.serve.process import ServerProcess, scrape_metrics  # noqa: E402


@dataclass(frozen=True)
class Plan:
    backend: str
    device: str
    shape: str
    rates: tuple[float, ...]
    refine: int
    duration: float
    drain: float
    input_len: int
    output_len: int
    range_ratio: float
    warmup_requests: int
    warmup_output: int
    max_num_seqs: int
    total_seconds: float
    startup_timeout: float


# a 7B at ~1024-token prompts: finely spaced where both formats saturate (serve_h200.json)
GPU = Plan("cuda", "cuda", "llama-2-7b", (8.0, 12.0, 16.0, 20.0, 24.0, 32.0), 1, 20.0, 12.0, 1024, 256, 0.5, 16, 16, 256,
           480.0, 300.0)
TINY = Plan("reference", "cpu", "tiny", (2.0, 4.0), 0, 2.0, 6.0, 32, 8, 0.5, 2, 4, 16, 150.0, 120.0)


# -- the child process: kernels and artifacts ------------------------------------------------------
def prepare(device: str, shape: str, formats: list[str], scratch: str, seed: int) -> dict:
    import torch

    from bench.e2e_h200 import ensure_artifact
    from qoq.export.random_artifact import SHAPES, artifact_weight_bytes

    out = {"artifacts": {}, "vocab_size": SHAPES[shape]["vocab_size"]}
    if device == "cuda":
        from qoq.runtime_cuda import attention, gemm

        t = time.perf_counter()
        gemm.extension(), attention.extension()  # built once here, found in the cache by the servers
        out["kernel_build_s"] = round(time.perf_counter() - t, 1)
        out["gpu"] = torch.cuda.get_device_name()
    for fmt in formats:
        path, info = ensure_artifact(Path(scratch), shape, fmt, seed, device)
        out["artifacts"][fmt] = {"path": str(path), **info, "weight_bytes": artifact_weight_bytes(path)}
    return out


def in_child(fn, *args):
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# -- one format ----------------------------------------------------------------------------------
def next_rate(tried: dict[float, bool], grid: tuple[float, ...], refine_left: int) -> tuple[float, bool] | None:
    """(rate, is_refinement) of the next run, or None when the search is done."""
    passed = [r for r, ok in tried.items() if ok]
    lo = max(passed, default=None)
    hi = min((r for r, ok in tried.items() if not ok and (lo is None or r > lo)), default=None)
    if hi is None:
        above = [r for r in grid if (lo is None or r > lo) and r not in tried]
        return (above[0], False) if above else None
    if refine_left <= 0:
        return None
    if lo is None:
        return round(hi / 2, 2), True
    mid = round(math.sqrt(lo * hi), 2)
    return ((mid, True) if lo < mid < hi and hi / lo > 1.1 else None)


def pages_after(url: str, before: dict[str, float]) -> dict:
    """Once the server is idle: KV pages still held (leaked) and what the server counted during the run."""
    after = settle(url)

    def delta(name: str) -> int:
        return int(after.get(name, 0) - before.get(name, 0))

    five = sum(int(v - before.get(k, 0)) for k, v in after.items() if k.startswith('qoq_http_responses_total{code="5'))
    return {"leaked_pages": int(after["qoq_kv_pages_total"] - after["qoq_kv_pages_free"]),
            "server_idle": after["qoq_requests_running"] == 0 and after["qoq_requests_waiting"] == 0,
            "server_aborts": delta('qoq_requests_total{status="abort"}'),
            "server_errors": delta('qoq_requests_total{status="error"}') + five,
            "server_generated_tokens": delta("qoq_generation_tokens_total")}


def measure(url: str, model: str, specs, deadline: float, slo: float) -> dict:
    before = scrape_metrics(url)
    results, elapsed = asyncio.run(run_load(url, model, specs, deadline))
    return {**run_stats(results, elapsed, slo), **pages_after(url, before)}


def run_format(name: str, art: dict, args, plan: Plan, workload: Workload, fmt: dict, save, end: float) -> None:
    server_args = ["--backend", plan.backend, "--served-model-name", name, "--max-num-seqs", str(args.max_num_seqs),
                   "--drain-timeout", "5"]
    if args.max_num_batched_tokens:
        server_args += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.kv_budget:
        server_args += ["--kv-budget", str(args.kv_budget)]
    fmt.update(server_args=server_args, server_log=f"server_{name}.log", runs=[])
    t = time.perf_counter()
    server = ServerProcess(art["path"], args.out / fmt["server_log"], server_args)
    try:
        server.wait_healthy(min(args.startup_timeout, max(1.0, end - time.perf_counter())))
        fmt["startup_s"] = round(time.perf_counter() - t, 1)
        fmt["kv_pages_total"] = int(scrape_metrics(server.url)["qoq_kv_pages_total"])
        print(f"{name}: serving after {fmt['startup_s']} s, {fmt['kv_pages_total']} KV pages", flush=True)
        specs = burst(workload, args.warmup_requests, args.warmup_output)
        fmt["warmup"] = {"requests": len(specs), **measure(server.url, name, specs, 120.0, args.slo_ttft_p99)}
        save()
        tried: dict[float, bool] = {}
        refine_left = args.refine
        while (nxt := next_rate(tried, args.rates, refine_left)) is not None:
            rate, refining = nxt
            if end - time.perf_counter() < args.duration + args.drain + 5:
                fmt["stopped"] = f"out of time before {rate} req/s (--total-seconds)"
                break
            refine_left -= refining
            specs = schedule(workload, rate, args.duration)
            row = {"rate": rate, **measure(server.url, name, specs, args.duration + args.drain, args.slo_ttft_p99)}
            tried[rate] = row["sustainable"]
            fmt["runs"].append(row)
            print(f"{name} {rate:g} req/s: {row['output_tok_s']} tok/s, TTFT p50/p99 {row['ttft_p50_ms']}/"
                  f"{row['ttft_p99_ms']} ms, ITL p50/p99 {row['itl_p50_ms']}/{row['itl_p99_ms']} ms, "
                  f"{row['errors']} errors, {row['cut']} cut, {row['leaked_pages']} pages leaked"
                  f"{'' if row['sustainable'] else '  (not sustainable)'}", flush=True)
            save()
    except Exception as e:  # noqa: BLE001 - recorded; the next format still runs
        fmt["error"] = f"{type(e).__name__}: {e}"[:500]
        print(f"{name} failed: {fmt['error']}", flush=True)
    finally:
        fmt["server_exit_code"] = server.stop()
        fmt["wall_s"] = round(time.perf_counter() - t, 1)
        save()


# -- main ----------------------------------------------------------------------------------------
def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny shape, reference backend, two rates")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/qoq_e2e"), help="where artifacts are built")
    ap.add_argument("--seed", type=int, default=0, help="the artifacts' weights and the workload")
    ap.add_argument("--rates", help="ascending request rates (req/s) the search starts from, comma-separated")
    ap.add_argument("--refine", type=int, help="bisection runs after the first unsustainable rate")
    ap.add_argument("--duration", type=float, help="seconds of arrivals per rate")
    ap.add_argument("--drain", type=float, help="seconds after the arrivals before running requests are cut")
    ap.add_argument("--slo-ttft-p99", type=float, default=2.0, help="sustainable: p99 TTFT below this (s)")
    ap.add_argument("--input-len", type=int)
    ap.add_argument("--output-len", type=int)
    ap.add_argument("--range-ratio", type=float, help="lengths uniform in [len*(1-r), len*(1+r)]")
    ap.add_argument("--warmup-requests", type=int)
    ap.add_argument("--max-num-seqs", type=int)
    ap.add_argument("--max-num-batched-tokens", type=int, help="the server's (default: its own, 2048)")
    ap.add_argument("--kv-budget", type=int, help="the server's KV bytes (default: its own)")
    ap.add_argument("--total-seconds", type=float, help="the whole run's bound, kernel and artifact builds included")
    ap.add_argument("--startup-timeout", type=float)
    args = ap.parse_args()
    plan = TINY if args.tiny else GPU
    for key in ("refine", "duration", "drain", "input_len", "output_len", "range_ratio", "warmup_requests",
                "max_num_seqs", "total_seconds", "startup_timeout"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(plan, key))
    try:
        args.rates = tuple(float(r) for r in args.rates.split(",")) if args.rates else plan.rates
    except ValueError:
        ap.error(f"--rates must be numbers, comma-separated (got {args.rates!r})")
    if not args.rates or any(r <= 0 for r in args.rates) or list(args.rates) != sorted(set(args.rates)):
        ap.error(f"--rates must be positive and ascending (got {args.rates})")
    args.formats = args.formats.split(",")
    if not args.formats or any(f not in FORMATS for f in args.formats):
        ap.error(f"--formats: a comma-separated subset of {', '.join(FORMATS)} (got {','.join(args.formats)})")
    if args.drain < args.slo_ttft_p99:
        ap.error("--drain must be >= --slo-ttft-p99 (a request cut before its first token must miss the SLO)")
    args.warmup_output = plan.warmup_output
    return args, replace(plan, rates=args.rates)


def raise_open_file_limit() -> None:
    """A socket per request in flight, here and in the server (which inherits the limit): an overloaded
    run holds rate x (duration + drain) of them at once, past a common soft limit of 1024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 16 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:  # a sandbox may refuse: runs past the limit then fail visibly
            print(f"open-file limit stays {soft}: {e}", flush=True)


def main() -> None:
    start = time.perf_counter()
    args, plan = parse_args()
    raise_open_file_limit()
    end = start + args.total_seconds
    args.out.mkdir(parents=True, exist_ok=True)
    out_json = args.out / "serve_h200.json"
    command = "PYTHONPATH=. python bench/serve_h200.py " + " ".join(
        "$OUT" if a == str(args.out) else a for a in sys.argv[1:])
    result = {"command": command, "gpu": f"cpu ({plan.backend} backend, tiny)" if plan.device == "cpu" else None,
              "shape": plan.shape, "formats_asked": args.formats, "slo_ttft_p99_s": args.slo_ttft_p99,
              "plan": {**asdict(plan), **{k: v for k, v in vars(args).items() if k in asdict(plan)}},
              "formats": {}}

    def save() -> None:
        out_json.write_text(json.dumps({"summary": summarize(result), **result}, indent=1, default=str))

    print(f"preparing kernels and artifacts ({', '.join(args.formats)}, {plan.shape})", flush=True)
    t = time.perf_counter()
    try:
        prep = in_child(prepare, plan.device, plan.shape, args.formats, str(args.scratch), args.seed)
    except Exception as e:  # a kernel or artifact build failed: nothing to serve
        result["error"] = f"preparing kernels and artifacts failed: {type(e).__name__}: {e}"[:1000]
        save()
        sys.exit(result["error"])
    result.update(prepare_s=round(time.perf_counter() - t, 1), kernel_build_s=prep.get("kernel_build_s"),
                  artifacts=prep["artifacts"])
    result["gpu"] = prep.get("gpu", result["gpu"])
    workload = Workload(args.input_len, args.output_len, args.range_ratio, prep["vocab_size"], args.seed)
    result["workload"] = asdict(workload)
    save()
    for i, name in enumerate(args.formats):
        share_end = time.perf_counter() + (end - time.perf_counter()) / (len(args.formats) - i)
        result["formats"][name] = {}
        run_format(name, prep["artifacts"][name], args, plan, workload, result["formats"][name], save, share_end)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    save()
    try:
        plot(result, args.out / "serve_h200.png")
    except ImportError as e:
        print(f"no plot (matplotlib missing: {e}); the JSON has every number", flush=True)
    print(json.dumps(summarize(result), indent=1), flush=True)


if __name__ == "__main__":
    main()
