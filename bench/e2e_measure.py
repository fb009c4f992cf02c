"""The measurements of bench/e2e_h200.py, on a loaded LLMEngine (any backend): each adds its own
requests, aborts whatever is left on exit (timeout or error), and returns result rows."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch

from qoq.engine import LLMEngine, SamplingParams
from qoq.engine.block_manager import pages_for


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed)).tolist()


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes/s of a large device-to-device copy_ (read + write), median of 10 (CUDA events on the GPU)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times)


@contextmanager
def tracked(engine: LLMEngine):
    """Request ids a measurement adds; whatever is unfinished on exit (timeout, error) is aborted."""
    rids: list[int] = []
    try:
        yield rids
    finally:
        for rid in rids:
            engine.abort(rid)
        while engine.has_unfinished():  # only the aborts' final outputs are left
            engine.step()


def step_until(engine: LLMEngine, done, deadline: float) -> tuple[int, bool]:
    """Step until done() or the deadline -> (output tokens produced, whether done() was reached)."""
    tokens = 0
    while not done():
        if time.perf_counter() > deadline:
            return tokens, False
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    return tokens, True


def measure_ttft(engine, plan, vocab: int, deadline: float) -> list[dict]:
    times = []
    for rep in range(plan.ttft_reps + 1):  # rep 0 warms up (first-use costs)
        with tracked(engine) as rids:
            t = time.perf_counter()
            rids.append(engine.add_request(prompts(1, plan.prompt, vocab, 100 + rep)[0],
                                           SamplingParams(max_tokens=1, ignore_eos=True)))
            if not step_until(engine, lambda: not engine.has_unfinished(), deadline)[1]:
                raise TimeoutError("ttft ran past --max-seconds")
            if rep:
                times.append(time.perf_counter() - t)
    return [{"kind": "ttft", "prompt_tokens": plan.prompt, "ms": 1e3 * statistics.median(times),
             "reps_ms": [1e3 * t for t in times]}]


def graph_gpu_ms(engine, batch: int, context: int, reps: int) -> tuple[float | None, str | None]:
    """GPU time of one replay of the decode graph a step of `batch` sequences at `context` tokens uses."""
    graphs = getattr(engine.runner, "graphs", None)
    if graphs is None:
        return None, "no CUDA graphs on this backend"
    key = graphs.bucket(batch, pages_for(context))
    if key not in graphs.graphs:
        return None, f"batch {batch} ran eagerly (no graph bucket)"
    graph = graphs.graphs[key][0]
    graph.replay()  # rewrites the last step's K/V slots with the same values: harmless
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps, None


def measure_sweep(engine, plan, vocab: int, deadline: float, roofline) -> list[dict]:
    per_seq = plan.prompt + plan.output  # no sequence generates plan.output tokens during the sweep
    fits = engine.blocks.num_pages // pages_for(per_seq)
    rows = []
    with tracked(engine) as rids:
        for batch in sorted(plan.sweep):
            if batch > fits:
                rows.append({"kind": "sweep", "batch": batch, "skipped": f"the KV pool holds {fits} sequences "
                             f"of {per_seq} tokens"})
                continue
            new = prompts(batch - len(rids), plan.prompt, vocab, 1000 + batch)
            fresh = [engine.add_request(p, SamplingParams(max_tokens=plan.output, ignore_eos=True)) for p in new]
            rids += fresh
            if not step_until(engine, lambda: all(engine.sequence(r).output_ids for r in fresh), deadline)[1]:
                rows.append({"kind": "sweep", "batch": batch, "skipped": "prefill ran past --max-seconds"})
                break  # the smaller batches' rows stay
            for _ in range(plan.warm_steps):  # a bucket not captured up front is captured here
                engine.step()
            walls = []
            for _ in range(plan.decode_steps):
                t = time.perf_counter()
                engine.step()
                walls.append(time.perf_counter() - t)
                if time.perf_counter() > deadline:
                    break
            if any(engine.sequence(r) is None for r in rids):
                raise RuntimeError(f"a sequence reached max_tokens={plan.output} inside the sweep")
            ms = 1e3 * statistics.median(walls)
            context = max(len(engine.sequence(r)) for r in rids)
            gpu_ms, why = graph_gpu_ms(engine, batch, context, plan.decode_steps)
            row = {"kind": "sweep", "batch": batch, "steps": len(walls), "context_len": context,
                   "ms_per_step": ms, "decode_tok_s": batch * len(walls) / sum(walls), "graph_gpu_ms": gpu_ms,
                   "host_overhead_fraction": None if gpu_ms is None else max(0.0, 1 - gpu_ms / ms)}
            if why:
                row["host_overhead_reason"] = why
            if batch == 1:
                row["roofline_ms"] = 1e3 * roofline(context)
                row["roofline_fraction"] = row["roofline_ms"] / ms
            rows.append(row)
            print(f"  sweep B={batch}: {ms:.2f} ms/step, {row['decode_tok_s']:.0f} tok/s, "
                  f"graph {gpu_ms} ms", flush=True)
    return rows


def measure_max_throughput(engine, plan, vocab: int, deadline: float, n: int, budget: str,
                           kv_bytes: int, capacity: int) -> list[dict]:
    row = {"kind": "max_throughput", "budget": budget, "kv_budget_bytes": kv_bytes, "capacity": capacity,
           "requests": n, "prompt_tokens": plan.prompt, "output_tokens_per_request": plan.output}
    if n < 1:
        return [{**row, "skipped": "the budget admits no request"}]
    preempted = engine.scheduler.num_preemptions
    params = SamplingParams(max_tokens=plan.output, ignore_eos=True)
    with tracked(engine) as rids:
        t = time.perf_counter()
        rids += [engine.add_request(p, params) for p in prompts(n, plan.prompt, vocab, 7)]
        tokens, finished = step_until(engine, lambda: not engine.has_unfinished(), deadline)
        truncated = not finished
        seconds = time.perf_counter() - t
    row.update(output_tokens=tokens, seconds=seconds, output_tok_s=tokens / seconds, truncated=truncated,
               preemptions=engine.scheduler.num_preemptions - preempted)
    print(f"  max throughput {budget}: {n} requests, {row['output_tok_s']:.0f} tok/s"
          + (" (TRUNCATED)" if truncated else ""), flush=True)
    return [row]
