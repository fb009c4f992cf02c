"""Host time of an engine decode step, no GPU needed: the engine's own code with the model stubbed out.

    PYTHONPATH=. python bench/engine_host_overhead.py --out DIR [--batches 1,64,256] [--context 1024]
        [--steps 200] [--profile 256] [--tokenizer DIR]

A tiny random W4A8KV4 artifact loads into the CUDA runner on the CPU (ops="reference"); then prefill
returns preallocated logits at once, and decode steps go through the runner's real graph path
(CudaRunner.forward -> DecodeGraphs.run: bucket choice, input building, copies into the graph's static
buffers, the logits copy out) with a graph whose replay does nothing and whose logits buffer holds fixed
values. So LLMEngine.step's wall time here is what a decode step costs the host beside the GPU's work:
scheduling, page accounting, input tensors, sampling, stop checks, outputs (and detokenization with
--tokenizer). The vocabulary is small (--vocab) so that the logits' dtype copy and argmax, kernels on a
GPU, cost little CPU time here. Per batch B: B requests of --context prompt tokens, prefilled, then
--warmup decode steps, then --steps timed ones (wall time: median, mean, p90 in microseconds; and
the median of the thread's CPU time, which a busy host inflates less). --profile B prints
cProfile's top functions (by own time) over as many more steps of batch B.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qoq.engine import LLMEngine, SamplingParams  # noqa: E402
from qoq.engine.block_manager import pages_for  # noqa: E402
from qoq.engine.cuda_graphs import DecodeGraphs  # noqa: E402
from qoq.export.random_artifact import write_random_artifact  # noqa: E402

SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": 4096, "rope_theta": 10000.0, "bos_token_id": 1,
         "eos_token_id": 2}
GRAPH_SIZES = (1, 2, 4, *range(8, 257, 8))  # what bench/e2e_h200.py captures


class _NoReplay:
    def replay(self) -> None:
        pass


class HostGraphs(DecodeGraphs):
    """DecodeGraphs whose captures make the static inputs on the runner's device and a graph that does
    nothing: run() is the real code; the logits are the fixed `logits` rows."""

    def __init__(self, runner, batch_sizes, logits: torch.Tensor):
        super().__init__(runner, batch_sizes)
        self.fixed_logits = logits

    def capture(self, batch: int, pages: int) -> None:
        self.graphs[(batch, pages)] = (_NoReplay(), self.static_inputs(batch, pages), self.fixed_logits[:batch])


def max_tokens(batch: int, warmup: int, steps: int) -> int:
    """Enough that no request finishes before the timed steps end (the first admitted ones decode
    during the others' prefill steps, at most one step per request)."""
    return batch + warmup + 2 * steps + 2  # twice the steps: the profiled ones follow the timed ones


def make_engine(artifact: Path, max_batch: int, context: int, max_tokens: int, vocab: int, tokenizer):
    tokens = max_batch * pages_for(context + max_tokens) * 64 + 64
    page_bytes = 2 * SHAPE["num_hidden_layers"] * SHAPE["num_key_value_heads"] * 64 * (64 // 2 + 4)
    engine = LLMEngine(artifact, backend="cuda", device="cpu", ops="reference", cuda_graphs=False,
                       kv_budget=(tokens // 64 + 2) * page_bytes, max_num_seqs=max(256, max_batch),
                       max_num_batched_tokens=8192, tokenizer=tokenizer)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(max(GRAPH_SIZES[-1], max_batch), vocab, generator=gen).half()
    engine.runner.graphs = HostGraphs(engine.runner, GRAPH_SIZES, logits)
    return engine, logits


def prefill(engine, logits: torch.Tensor) -> None:
    """Run the waiting prompts' prefill steps with the model stubbed: each returns fixed logits."""
    runner = engine.runner
    runner.forward = lambda step, return_all_logits=False: logits[: len(step.chunks)].float()
    try:
        while engine.scheduler.waiting or any(s.num_uncomputed > 1 for s in engine.scheduler.running):
            engine.step()
    finally:
        del runner.forward  # back to CudaRunner.forward


def measure(engine, logits, batch: int, context: int, warmup: int, steps: int, vocab: int, profile: bool):
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(max_tokens=max_tokens(batch, warmup, steps), ignore_eos=True)
    ids = [engine.add_request(torch.randint(3, vocab, (context,), generator=gen).tolist(), params)
           for _ in range(batch)]
    prefill(engine, logits)
    for _ in range(warmup):
        engine.step()
    times, cpu_times = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.thread_time()
        out = engine.step()
        times.append(time.perf_counter() - t)
        cpu_times.append(time.thread_time() - c)
        assert len(out) == batch and all(o.new_token_ids for o in out), "not a decode step of every request"
    text = None
    if profile:  # as many steps again, under the profiler (which slows them: not timed)
        prof = cProfile.Profile()
        prof.runcall(lambda: [engine.step() for _ in range(steps)])
        stream = io.StringIO()
        pstats.Stats(prof, stream=stream).sort_stats("tottime").print_stats(25)
        text = stream.getvalue()
    for rid in ids:
        engine.abort(rid)
    engine.step()  # reports the aborts
    us = sorted(t * 1e6 for t in times)
    row = {"batch": batch, "context": context, "steps": steps, "median_us": statistics.median(us),
           "mean_us": statistics.fmean(us), "p90_us": us[int(0.9 * (len(us) - 1))],
           "cpu_median_us": statistics.median(t * 1e6 for t in cpu_times),
           "per_seq_us": statistics.median(us) / batch}
    if text is not None:
        row["profile"] = text
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for engine_host_overhead.json")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens per request")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=256, help="vocabulary of the stub logits (and the model)")
    ap.add_argument("--profile", type=int, default=None, metavar="B", help="cProfile the timed steps of batch B")
    ap.add_argument("--tokenizer", default=None, help="a HF tokenizer folder: detokenize as serving does")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if min(batches) < 1 or args.steps < 1 or args.context < 1:
        sys.exit("--batches, --steps and --context must be >= 1")
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        args.vocab = max(args.vocab, len(tokenizer))
    torch.set_num_threads(1)  # the engine's host work is one thread; keep torch's CPU ops that way too
    with tempfile.TemporaryDirectory() as tmp:
        art = write_random_artifact(Path(tmp) / "art", {**SHAPE, "vocab_size": args.vocab}, "w4a8kv4g128",
                                    tokenizer=None)
        top = max(batches)
        engine, logits = make_engine(art, top, args.context, max_tokens(top, args.warmup, args.steps), args.vocab,
                                     tokenizer)
        rows = []
        for b in batches:
            row = measure(engine, logits, b, args.context, args.warmup, args.steps, args.vocab, args.profile == b)
            print(f"B={b:4d}: {row['median_us']:9.1f} us/step median ({row['mean_us']:.1f} mean, "
                  f"{row['p90_us']:.1f} p90, {row['cpu_median_us']:.1f} CPU-time median; "
                  f"{row['per_seq_us']:.2f} us per sequence)", flush=True)
            if "profile" in row:
                print(row["profile"])
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"torch": torch.__version__, "python": sys.version.split()[0], "tokenizer": args.tokenizer,
              "vocab": args.vocab, "rows": rows}
    (out / "engine_host_overhead.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'engine_host_overhead.json'}")


if __name__ == "__main__":
    main()
