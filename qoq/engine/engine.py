"""LLMEngine: requests in, tokens and text out, one scheduler step at a time, on any runner.

    engine = LLMEngine("artifact/", backend="reference", kv_budget=64 << 20)
    rid = engine.add_request("Hello", SamplingParams(max_tokens=16))
    while engine.has_unfinished():
        for out in engine.step(): ...

All state lives in the engine; add_request, step and abort take one lock, so a server thread may call
abort (or add_request) between (or during) another thread's steps.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from qoq.engine.batch import SeqChunk, StepInput, build_step_input
from qoq.engine.block_manager import BlockManager, pages_for
from qoq.engine.detokenize import Detokenizer, TokenBytes
from qoq.engine.model_loading import eos_token_ids, load_tokenizer_or_none
from qoq.engine.params import SamplingParams
from qoq.engine.sampler import request_seed, sample
from qoq.engine.scheduler import Scheduler
from qoq.engine.sequence import Completion, RequestOutput, Sequence

DEFAULT_CPU_KV_BUDGET = 256 << 20


def make_runner(backend: str, artifact_dir, kv_budget: int | None, kv_fraction: float, **options):
    if backend == "reference":
        quantization = options.pop("quantization", None)
        if quantization is not None:
            raise ValueError(f"quantization={quantization!r} runs on the cuda backend only")
        from qoq.engine.runner_reference import ReferenceRunner

        return ReferenceRunner(artifact_dir, kv_budget or DEFAULT_CPU_KV_BUDGET, **options)
    if backend == "cuda":
        from qoq.engine.runner_cuda import CudaRunner  # imports the kernels: GPU only

        return CudaRunner(artifact_dir, kv_budget=kv_budget, kv_fraction=kv_fraction, **options)
    raise ValueError(f"unknown backend {backend!r} (reference or cuda)")


class LLMEngine:
    def __init__(self, artifact_dir: str | Path, backend: str = "reference", kv_budget: int | None = None,
                 kv_fraction: float = 0.9, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, record_logits: bool = False, tokenizer=None, **runner_options):
        self.artifact_dir = Path(artifact_dir)
        self.runner = make_runner(backend, artifact_dir, kv_budget, kv_fraction, **runner_options)
        self.blocks = BlockManager(self.runner.num_pages)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens)
        self.max_model_len = min(max_model_len or self.runner.max_model_len, self.runner.max_model_len)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer_or_none(artifact_dir)
        self._token_bytes = TokenBytes(self.tokenizer) if self.tokenizer is not None else None
        self.eos_ids = eos_token_ids(artifact_dir, self.tokenizer, self.runner.config.hf)
        self.record_logits = record_logits
        self._seqs: dict[int, Sequence] = {}
        self._pending: list[RequestOutput] = []  # aborts, reported by the next step
        self._next_id = 0
        self._lock = threading.RLock()
        self.stats = {"steps": 0, "forward_s": 0.0, "prefill_tokens": 0, "decode_tokens": 0}

    def capture_graphs(self) -> int:
        """Capture every decode CUDA graph the scheduler's batches can use now (a server's warm-up;
        otherwise each is captured on first use) -> graphs captured (0 without graphs)."""
        graphs = getattr(self.runner, "graphs", None)
        return 0 if graphs is None else graphs.capture_every(self.scheduler.max_num_seqs)

    # -- requests ------------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"{self.artifact_dir} has no tokenizer: give prompt token ids")
        return self.tokenizer(prompt)["input_ids"]

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> int:
        params = params or SamplingParams()
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens leaves no room under max_model_len {self.max_model_len}")
        longest = min(len(ids) + params.max_tokens, self.max_model_len)
        if pages_for(longest) > self.blocks.num_pages:
            raise ValueError(f"a request of up to {longest} tokens needs {pages_for(longest)} KV pages; "
                             f"the budget holds {self.blocks.num_pages}")
        with self._lock:
            rid, self._next_id = self._next_id, self._next_id + 1
            seq = Sequence(rid, ids, params, arrival=rid)
            if self._token_bytes is not None:
                seq.detok = Detokenizer(self._token_bytes, params.stop)
            seq.logits = []
            self._seqs[rid] = seq
            self.scheduler.add(seq)
            return rid

    def abort(self, request_id: int) -> bool:
        """Stop a request and free its pages; its final output (reason "abort") comes with the next step."""
        with self._lock:
            seq = self._seqs.pop(request_id, None)
            if seq is None or seq.is_finished:
                return False
            self.scheduler.finish(seq, "abort")
            self._pending.append(RequestOutput(request_id, [], "", True, "abort"))
            return True

    def has_unfinished(self) -> bool:
        with self._lock:
            return self.scheduler.has_unfinished() or bool(self._pending)

    def sequence(self, request_id: int) -> Sequence | None:
        return self._seqs.get(request_id)

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        with self._lock:
            outputs, self._pending = self._pending, []
            scheduled = self.scheduler.schedule()
            if not scheduled:
                return outputs
            step = build_step_input(scheduled, self.blocks)
            t0 = time.perf_counter()
            logits = self.runner.forward(step)
            self.stats["forward_s"] += time.perf_counter() - t0
            self.stats["steps"] += 1
            self.stats["decode_tokens" if step.is_decode else "prefill_tokens"] += len(step.token_ids)
            self.scheduler.update(scheduled)
            seqs = [s.seq for s in scheduled if s.samples]
            if not seqs:
                return outputs
            if len(seqs) < len(scheduled):
                logits = logits[[i for i, s in enumerate(scheduled) if s.samples]]
            params = [seq.params for seq in seqs]
            for seq in seqs:
                if seq.seed is None and not seq.params.greedy:  # a sampled request's first draw
                    seq.seed = request_seed(seq.params)
            tokens = sample(logits, params, [seq.seed for seq in seqs], [len(seq.output_ids) for seq in seqs])
            if self.record_logits:
                for seq, row in zip(seqs, logits.detach().float().cpu()):
                    seq.logits.append(row)
            append = self._append_token
            outputs += [append(seq, token) for seq, token in zip(seqs, tokens)]
            return outputs

    def _append_token(self, seq: Sequence, token: int) -> RequestOutput:
        out = seq.output_ids
        out.append(token)
        p = seq.params
        detok = seq.detok
        delta = detok.push(token) if detok is not None else ""
        reason = None
        if (token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_ids)
                or (detok is not None and detok.stopped)):
            reason = "stop"
        elif len(out) >= p.max_tokens or len(out) + len(seq.prompt_ids) >= self.max_model_len:
            reason = "length"
        if reason is not None:
            if detok is not None:
                delta += detok.flush()
            self.scheduler.finish(seq, reason)
            self._seqs.pop(seq.seq_id, None)
        if delta:
            seq.text += delta
        return RequestOutput(seq.seq_id, [token], delta, reason is not None, reason)

    # -- scoring -------------------------------------------------------------------------------
    def prompt_logits(self, token_ids: list[int], chunk_tokens: int | None = None) -> torch.Tensor:
        """Logits fp32 [T, V] at every position of `token_ids` (on the runner's device): the tokens are
        prefilled in chunks of `chunk_tokens` (default: max_num_batched_tokens) through the runner,
        which writes their K/V to real pages (KV4 through rope_kv4_write) and lets later chunks attend
        over them, exactly as serving a prompt does; the pages are freed afterwards. What `qoq eval
        --backend cuda` scores. Not scheduled: it runs at once, between steps, under the engine lock."""
        ids = [int(t) for t in token_ids]
        chunk = chunk_tokens or self.scheduler.max_num_batched_tokens
        if not ids or chunk < 1:
            raise ValueError("prompt_logits needs tokens and a chunk of >= 1 token")
        if len(ids) > self.max_model_len:
            raise ValueError(f"{len(ids)} tokens exceed max_model_len {self.max_model_len}")
        with self._lock:
            if pages_for(len(ids)) > self.blocks.num_free_pages:
                raise ValueError(f"{len(ids)} tokens need {pages_for(len(ids))} KV pages; "
                                 f"{self.blocks.num_free_pages} are free")
            rid, self._next_id = self._next_id, self._next_id + 1
            out = []
            try:
                for start in range(0, len(ids), chunk):
                    n = min(chunk, len(ids) - start)
                    slots = self.blocks.allocate(rid, n)
                    step = StepInput(ids[start : start + n], list(range(start, start + n)), slots,
                                     [SeqChunk(start, n, self.blocks.pages(rid))])
                    out.append(self.runner.forward(step, return_all_logits=True))
                    self.stats["prefill_tokens"] += n
            finally:
                self.blocks.free(rid)
            return torch.cat(out)

    # -- convenience ---------------------------------------------------------------------------
    def generate(self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 on_output=None) -> list[Completion]:
        """Run prompts to completion (together, continuously batched); results in prompt order."""
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        seqs = {rid: self._seqs[rid] for rid in ids}
        results = {rid: Completion(rid, seqs[rid].prompt_ids) for rid in ids}
        while any(r.finish_reason is None for r in results.values()):
            for out in self.step():
                if out.request_id not in results:
                    continue
                r = results[out.request_id]
                r.token_ids += out.new_token_ids
                r.text += out.text_delta
                r.finish_reason = out.finish_reason
                if on_output is not None:
                    on_output(out)
        for rid, r in results.items():
            r.logits = seqs[rid].logits
        return [results[rid] for rid in ids]
