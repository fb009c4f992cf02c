"""End-to-end engine benchmark: W4A8KV4 (g128) vs FP16 and FP8 on random-weight artifacts of real shapes.

    PYTHONPATH=. python bench/e2e_h200.py --out $OUT --shapes llama-2-7b [--formats w4a8kv4,fp16,fp8]
    python bench/e2e_h200.py --tiny --out DIR [--tiny-cuda-runner]   # CPU smoke run of the same code
    python bench/e2e_h200.py --merge A.json B.json --out DIR          # one JSON and plot from several runs

Per shape and format: build (or reuse, keyed by shape, recipe, seed and device) a random artifact under
--scratch (qoq.export.random_artifact; no tokenizer: prompts are random ids, no detokenization is
timed; fp8 reuses the fp16 artifact, quantized at load by `LLMEngine(..., quantization="fp8")`, and
counts its e4m3 weight bytes, not the artifact's), load LLMEngine once with its default KV budget (a
fraction of free memory), capture the decode graphs up front, and measure, each measurement bounded by
--max-seconds (results are written after each):
- ttft: a 1024-token prompt alone, add_request to its first token (median; one warm-up first);
- sweep: batches 1..256 ascending, each adding and prefilling its new prompts, then timing decode steps
  (engine.step() wall time, every sequence one token); host overhead = 1 - GPU time of the step's CUDA
  graph (the same graph replayed back to back between CUDA events) / the step's wall time: whatever the
  step does outside the graph (scheduling, input tensors and copies, sampling) counts as overhead;
  the B=1 row's roofline = (weights streamed + KV read) / the copy_ bandwidth measured in this run;
- max throughput: 1024-in / 512-out requests, ignore_eos, as many as the budget holds at once (at most
  --max-concurrency), submitted together; output tokens / wall time, prefill included. "full": the
  engine's pool; "48gb": 48e9 B less the format's weight bytes of KV, run on the same engine with the
  requests that budget holds (all admitted at once, none preempted: the same schedule as a smaller pool).
  An out-of-memory error there is retried once at half the requests (the row says so).
The engine runs with --max-batched-tokens 8192 (a throughput setting; the engine's default is 2048).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e_measure import copy_bandwidth, measure_max_throughput, measure_sweep, measure_ttft  # noqa: E402
from bench.e2e_summary import plot, summarize  # noqa: E402
from qoq.engine import LLMEngine  # noqa: E402
from qoq.engine.block_manager import pages_for  # noqa: E402
from qoq.engine.fp8_linear import fp8_weight_bytes  # noqa: E402
from qoq.export.artifact import load_manifest  # noqa: E402
from qoq.export.random_artifact import SHAPES, artifact_weight_bytes, write_random_artifact  # noqa: E402
from qoq.models.llama import BLOCK_LINEARS  # noqa: E402
from qoq.runtime_cuda.attention_reference import PAGE_TOKENS  # noqa: E402

RECIPES = {"w4a8kv4": "w4a8kv4g128", "fp16": "fp16", "fp8": "fp16"}
FORMAT_OPTIONS = {"fp8": {"quantization": "fp8"}}  # runner options of a format beside the plan's
NOTES = [
    "FP16 is this engine's fp16 path: cuBLAS linears (F.linear) and decode attention by decode_attention_fp16, "
    "a paged FP16 kernel over the fp16 pages in place (csrc/attention_decode_fp16.cu, the KV4 kernel's design: "
    "one CTA per sequence, KV head and split, so each K/V byte is read once for all of a KV head's query "
    "heads; 16-byte copies, tensor-core math, fp32 softmax, split-K for long contexts), in the same CUDA "
    "graphs; bench/attention_h200.py times it against the KV4 kernel and SDPA (its fp16_paged keys).",
    "FP8 is vLLM's --quantization fp8 recipe in this engine: the fp16 artifact's block linears quantized at "
    "load to e4m3 per output channel, activations per token at each call (torch ops: an absmax, a division, "
    "a cast, where vLLM fuses one kernel), torch._scaled_mm with row-wise scales; lm_head, KV (fp16 pages) "
    "and attention as the fp16 path, so speedup_vs_fp8_* carries the fp16 path's attention too.",
    "Decode graphs: batch buckets 1, 2, 4, 8, 16, ..., 256 (multiples of 8, as vLLM captures), all captured "
    "before any timing; larger batches run eagerly. Page buckets are the engine's powers of two.",
]


@dataclass
class Plan:
    backend: str
    device: str
    prompt: int  # tokens per prompt
    output: int  # tokens per max-throughput request
    sweep: tuple[int, ...]
    warm_steps: int
    decode_steps: int
    ttft_reps: int
    max_concurrency: int
    small_budget: float | None  # bytes of weights + KV of the "48gb" budget
    small_kv_requests: int = 0  # where small_budget is None: KV for this many requests instead
    copy_bytes: int = 2 << 30
    options: dict = field(default_factory=dict)  # LLMEngine runner options


GPU = Plan("cuda", "cuda", 1024, 512, (1, 8, 32, 64, 128, 256), 4, 32, 3, 1024, 48e9,
           options={"graph_batch_sizes": (1, 2, 4, *range(8, 257, 8))})
TINY = Plan("reference", "cpu", 32, 20, (1, 2, 4), 1, 3, 2, 4, None, 2, 16 << 20)
# the CUDA runner's data flow with torch reference ops on the CPU (no graphs): --tiny --tiny-cuda-runner
TINY_CUDA_RUNNER = replace(TINY, backend="cuda", options={"device": "cpu", "ops": "reference", "kv_budget": 64 << 20})


def weight_bytes(path: Path, fmt: str) -> int:
    """What the format keeps on the GPU: the artifact's tensors, or for fp8 the block linears' e4m3 codes
    and fp32 channel scales in place of their fp16 weights (embedding, norms, biases, lm_head stay fp16)."""
    total = artifact_weight_bytes(path)
    if fmt != "fp8":
        return total
    linears = tuple(f".{name}.weight" for name in BLOCK_LINEARS)
    for name, entry in load_manifest(path)["tensors"].items():
        if name.endswith(linears):
            n, k = entry["shape"]
            total += fp8_weight_bytes(n, k) - 2 * n * k
    return total


def ensure_artifact(scratch: Path, shape: str, fmt: str, seed: int, device: str) -> tuple[Path, dict]:
    path = scratch / f"{shape}-{RECIPES[fmt]}-seed{seed}-{device}"
    try:
        source = load_manifest(path)["source"]
        if source.get("random_weights") and (source["shape"], source["seed"]) == (shape, seed):
            return path, {"reused": True}
    except Exception:  # absent or unreadable: build it (overwrite)
        pass
    t = time.perf_counter()
    write_random_artifact(path, shape, RECIPES[fmt], device=device, seed=seed, tokenizer=None, overwrite=True)
    return path, {"reused": False, "build_s": time.perf_counter() - t}


def free_engine() -> None:
    gc.collect()  # the runner and its graphs hold each other
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def capture_graphs(engine, sizes: tuple[int, ...], top: int, pages: int, run: dict) -> None:
    """Capture, before any timing, the decode graphs of every batch bucket up to the one holding `top`."""
    graphs = getattr(engine.runner, "graphs", None)
    if graphs is None:
        return
    t = time.perf_counter()
    graphs.batch_sizes = tuple(b for b in sizes if b < top) + tuple(b for b in sizes if b >= top)[:1]
    try:
        graphs.capture_all(graphs.bucket(1, pages)[1])
    except Exception as e:  # noqa: BLE001 (an OOM at a big bucket: the rest is captured on first use)
        run["graph_capture_error"] = f"{type(e).__name__}: {e}"[:300]
        free_engine()
    run["graph_capture_s"] = time.perf_counter() - t


def run_format(result: dict, args, plan: Plan, shape: str, fmt: str, end: float, save) -> None:
    base = {"shape": shape, "format": fmt}
    if end - time.perf_counter() < 60:  # not worth building and loading a model for
        result["rows"].append({**base, "kind": "load", "error": "skipped: out of --total-seconds"})
        return
    vocab = SHAPES[shape]["vocab_size"]
    print(f"{shape} {fmt}: artifact", flush=True)
    path, info = ensure_artifact(args.scratch, shape, fmt, args.seed, plan.device)
    weights = weight_bytes(path, fmt)
    run = {**base, "artifact": str(path), **info, "weight_bytes": weights}
    free_engine()  # the engine's default KV budget is a fraction of free memory: release the build's cache
    if plan.device == "cuda":  # what that budget starts from (a leak would show here)
        run["gpu_free_bytes_before_load"] = torch.cuda.mem_get_info()[0]
    t = time.perf_counter()
    backend, options = plan.backend, {**plan.options, **FORMAT_OPTIONS.get(fmt, {})}
    if options.get("quantization") and backend == "reference":  # the CUDA runner's path only: its torch ops
        backend, options = TINY_CUDA_RUNNER.backend, {**TINY_CUDA_RUNNER.options, **options}
        run["backend"] = "cuda runner, torch ops (the reference backend has no quantization option)"
    engine = LLMEngine(path, backend=backend, max_num_seqs=args.max_concurrency,
                       max_num_batched_tokens=args.max_batched_tokens, **options)
    runner = engine.runner
    page_bytes = runner.cache.storage.numel() * runner.cache.storage.element_size() // runner.num_pages
    per_request = pages_for(plan.prompt + plan.output)
    fits = engine.blocks.num_pages // per_request
    full_n = min(args.max_concurrency, fits)
    small_kv = (int(plan.small_budget - weights) if plan.small_budget is not None
                else (plan.small_kv_requests * per_request + 1) * page_bytes)
    small_fits = max(0, small_kv // page_bytes - 1) // per_request  # less the scratch page
    run.update(load_s=time.perf_counter() - t, num_pages=runner.num_pages, page_bytes=page_bytes,
               kv_pool_bytes=runner.num_pages * page_bytes, requests_fit_full=fits, requests_fit_48gb=small_fits)
    capture_graphs(engine, plan.options.get("graph_batch_sizes", ()), max(full_n, min(max(plan.sweep), fits)),
                   per_request, run)
    result["runs"].append(run)
    print(f"  loaded in {run['load_s']:.1f} s: {runner.num_pages} pages, {fits} requests fit", flush=True)
    streamed = weights - 2 * vocab * SHAPES[shape]["hidden_size"]  # a step reads one embedding row

    def roofline(context: int) -> float:
        return (streamed + page_bytes / PAGE_TOKENS * context) / result["copy_bandwidth_bytes_s"]

    steps = [("ttft", measure_ttft, ()), ("sweep", measure_sweep, (roofline,)),
             ("max_throughput", measure_max_throughput, (min(small_fits, full_n), "48gb", small_kv, small_fits)),
             ("max_throughput", measure_max_throughput, (full_n, "full", run["kv_pool_bytes"], fits))]
    for name, fn, extra in steps:
        rows, first_n = [], extra[0] if extra else None
        for attempt in range(2):  # an OOM at full concurrency is retried once at half
            left = end - time.perf_counter()
            if left < 5:
                rows = [{"kind": name, "skipped": "out of --total-seconds"}]
                break
            try:
                rows = fn(engine, plan, vocab, time.perf_counter() + min(args.max_seconds, left), *extra)
                if attempt:
                    rows = [{**r, "oom_retry_from": first_n} for r in rows]
                break
            except Exception as e:  # noqa: BLE001 (record it and go on with the next measurement)
                print(f"  {name} failed: {type(e).__name__}: {e}", flush=True)
                rows = [{"kind": name, "error": f"{type(e).__name__}: {e}"[:500]}]
                free_engine()
                if name != "max_throughput" or "OutOfMemory" not in type(e).__name__ or extra[0] < 2:
                    break
                extra = (extra[0] // 2, *extra[1:])
        result["rows"] += [{**base, **({"budget": extra[1]} if name == "max_throughput" else {}), **r}
                           for r in rows]
        save()
    del engine, runner
    free_engine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--formats", default="w4a8kv4,fp16,fp8")
    ap.add_argument("--tiny", action="store_true", help="CPU, reference backend, tiny shape and lengths")
    ap.add_argument("--tiny-cuda-runner", action="store_true", help="--tiny through the CUDA runner (torch ops)")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/qoq_e2e"), help="where artifacts are built")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=150.0, help="bound of each measurement")
    ap.add_argument("--max-concurrency", type=int, help="cap on max-throughput requests (default: the plan's)")
    ap.add_argument("--total-seconds", type=float, default=1e9, help="measurements starting later are skipped")
    ap.add_argument("--max-batched-tokens", type=int, default=8192,
                    help="the engine's token budget per step (8192: a throughput setting, as vLLM's benchmarks)")
    ap.add_argument("--merge", type=Path, nargs="+", help="result JSONs to combine (no measurement)")
    args = ap.parse_args()
    end = time.perf_counter() + args.total_seconds
    args.out.mkdir(parents=True, exist_ok=True)
    out_json = args.out / "e2e_h200.json"
    command = "PYTHONPATH=. python bench/e2e_h200.py " + " ".join(
        "$OUT" if a == str(args.out) else a for a in sys.argv[1:])

    def save() -> None:
        out_json.write_text(json.dumps({"summary": summarize(result), **result}, indent=1))

    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        result = {**{k: v for k, v in parts[0].items() if k != "summary"},
                  "command": " && ".join(p["command"] for p in parts),
                  "runs": [r for p in parts for r in p["runs"]], "rows": [r for p in parts for r in p["rows"]]}
        save()
        return finish(result, args.out)
    plan = TINY_CUDA_RUNNER if args.tiny_cuda_runner else TINY if args.tiny else GPU
    args.max_concurrency = args.max_concurrency or plan.max_concurrency
    shapes = ["tiny"] if plan is not GPU else args.shapes.split(",")
    formats = args.formats.split(",")
    for name in shapes + formats:
        if name not in SHAPES and name not in RECIPES:
            ap.error(f"unknown shape or format {name!r} "
                     f"(shapes: {', '.join(SHAPES)}; formats: {', '.join(RECIPES)})")
    if plan.device == "cuda" and not torch.cuda.is_available():
        sys.exit("the GPU plan needs CUDA (use --tiny for the CPU smoke run)")
    if plan.device == "cpu":  # a smoke run, not a timing: one thread avoids spin-waits on shared cores
        torch.set_num_threads(1)
    gpu = torch.cuda.get_device_name() if plan.device == "cuda" else f"cpu ({plan.backend} backend, tiny)"
    result = {"command": command, "gpu": gpu, "torch": torch.__version__, "plan": asdict(plan),
              "shapes": shapes, "formats": formats, "max_batched_tokens": args.max_batched_tokens,
              "max_concurrency": args.max_concurrency, "notes": NOTES, "runs": [], "rows": []}
    if plan.device == "cuda":  # a fresh machine builds the kernels once: time it apart
        from qoq.runtime_cuda import attention, gemm

        t = time.perf_counter()
        gemm.extension(), attention.extension()
        result["kernel_build_s"] = time.perf_counter() - t
        print(f"kernels built in {result['kernel_build_s']:.0f} s", flush=True)
    result["copy_bandwidth_bytes_s"] = copy_bandwidth(plan.device, plan.copy_bytes)
    print(f"copy bandwidth {result['copy_bandwidth_bytes_s'] / 1e9:.0f} GB/s", flush=True)
    save()
    for shape in shapes:
        for fmt in formats:
            try:
                run_format(result, args, plan, shape, fmt, end, save)
            except Exception as e:  # noqa: BLE001 (a failed load or build: the other formats still run)
                print(f"{shape} {fmt} failed: {type(e).__name__}: {e}", flush=True)
                result["rows"].append({"shape": shape, "format": fmt, "kind": "load",
                                       "error": f"{type(e).__name__}: {e}"[:500]})
                free_engine()
            save()
    finish(result, args.out)


def finish(result: dict, out: Path) -> None:
    try:
        plot(result, out / "e2e_h200.png")
    except ImportError as e:
        print(f"no plot (matplotlib missing: {e}); the JSON has every number", flush=True)
    print(json.dumps(summarize(result), indent=1), flush=True)


if __name__ == "__main__":
    main()
