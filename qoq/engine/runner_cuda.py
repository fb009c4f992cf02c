"""The CUDA runner: one forward over a batch of sequence chunks with the fused W4A8KV4 path

    (+residual) rmsnorm_quant -> W4A8 qkv -> rope_kv4_write -> decode_attention (paged KV4) / prefill attention
    -> quant -> W4A8 o_proj -> (+residual) rmsnorm_quant -> W4A8 gate_up -> silu_mul_quant -> W4A8 down

(fp16 residual, added to by the next norm kernel: vLLM's fused_add_rms_norm, the final norm's included; fp16
lm_head; Qwen2's qkv biases ride in the fused GEMM's bias; GQA in the kernels; RoPE scaling in the cos/sin
tables), or, for the fp16 artifact, the same loop with cuBLAS linears (F.linear) between fp16 kernels:
(+residual) rmsnorm_fp16, rope_kv_write_fp16 (RoPE and the fp16 page write), paged fp16 decode attention,
silu_mul_fp16 (docs/engine.md: the fp16 baseline's fused ops). With `quantization="fp8"` the fp16
artifact's block linears are quantized at load to W8A8 e4m3 (fp8_linear.py: torch._scaled_mm, per-token
activation scales; lm_head stays fp16), all else as the fp16 path. Decode steps replay CUDA graphs
(cuda_graphs.py); prefill runs eagerly. Prefill attends over the chunk's sequence read back from
the pages (dequantized KV4), which is what `qoq eval` computes (the executor fake-quantizes K and V
before attention), and keeps chunked prefill and recomputation exact.

`ops="reference"` swaps every kernel for its pure-torch reference (any device): the CPU tests run the
runner's whole data flow that way. With it, `dtype=torch.float32` keeps the activations in fp32 where the
kernels round them to fp16: the same data flow then computes the reference runner's numbers bit for bit
(tests/engine/test_flows_agree.py), which separates a data-flow bug from fp16 rounding. On a W4A8KV4 model
the rounding alone moves logits far more than its size suggests: an INT8 activation or KV4 code it flips
moves the output by a whole quantization step (docs/engine.md, Numerics).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from qoq.engine.batch import StepInput
from qoq.engine.cuda_ops import KernelOps, ReferenceOps, fuse_w4a8
from qoq.engine.decode_inputs import DecodeInputs
from qoq.engine.fp8_linear import Fp8Linear
from qoq.engine.model_loading import artifact_format, kv_cache, outside_k_biases, rope_tables
from qoq.engine.prefill_inputs import PrefillInputs, prefill_inputs
from qoq.executor.build import load_artifact_model
from qoq.runtime_cuda import attention_reference as ref

ACTIVATION_RESERVE = 2 << 30  # bytes left free beside the KV pages (activations, graphs, logits)
QUANTIZATIONS = ("fp8",)  # `quantization=`: weights quantized at load from an fp16 artifact
DTYPES = (torch.float16, torch.float32)  # activations: fp16 (the kernels), fp32 (ops="reference" only)


class _Fp16Linear:
    """The fp16 path's linear: cuBLAS through F.linear."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _Unfused:
    """Linears reading one input, run one by one and concatenated: the W8A8 artifact's executor modules
    (SymmetricIntegerLinear: per-token INT8 through torch._int_mm on the GPU)."""

    def __init__(self, modules):
        self.modules = modules

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m(x) for m in self.modules], dim=-1)


class _Layer:
    """One decoder block's fused weights: W4A8 (`quantized`), else fp16 linears or, with `fp8`, e4m3
    ones quantized here from the fp16 weights (Fp8Linear; `kernel`: torch._scaled_mm, else its reference);
    `kind` "w4a16": the executor's dequantized weights as fp16 linears; "w8a8": its integer modules."""

    def __init__(self, block, quantized: bool, fp8: bool = False, kernel: bool = True, kind: str = "w4a8"):
        attn, mlp = block.self_attn, block.mlp
        self.ln1, self.ln2 = block.input_layernorm.weight, block.post_attention_layernorm.weight
        self.eps = block.input_layernorm.eps
        if kind == "w8a8":
            self.qkv = _Unfused([attn.q_proj, attn.k_proj, attn.v_proj])
            self.gate_up = _Unfused([mlp.gate_proj, mlp.up_proj])
            self.o, self.down = attn.o_proj, mlp.down_proj
        elif quantized:
            self.qkv = fuse_w4a8([attn.q_proj, attn.k_proj, attn.v_proj])
            self.gate_up = fuse_w4a8([mlp.gate_proj, mlp.up_proj])
            self.o, self.down = attn.o_proj, mlp.down_proj
        else:
            dtype = self.ln1.dtype  # W4A16's dequantized weights are fp32 buffers: cast like the float ones
            cat = lambda ms, name: (None if getattr(ms[0], name) is None
                                    else torch.cat([getattr(m, name) for m in ms]).to(dtype))
            linear = (lambda w, b: Fp8Linear.from_fp16(w, b, kernel)) if fp8 else _Fp16Linear
            qkv, gate_up = [attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]
            self.qkv = linear(cat(qkv, "weight"), cat(qkv, "bias"))
            self.gate_up = linear(cat(gate_up, "weight"), cat(gate_up, "bias"))
            self.o, self.down = (linear(cat([m], "weight"), cat([m], "bias")) for m in (attn.o_proj, mlp.down_proj))
        self.intermediate = mlp.gate_proj.out_features

    def drop_k_bias(self, q_width: int, k_width: int) -> None:
        """Zero the k slice of the fused qkv bias (a fresh tensor of this layer's: the executor's modules keep theirs)."""
        bias = getattr(self.qkv, "bias", None)
        if not isinstance(bias, torch.Tensor):
            raise ValueError("keeping the k bias outside the KV4 cache needs a fused qkv with its bias")
        self.qkv.bias = bias.clone()
        self.qkv.bias[q_width : q_width + k_width] = 0


class CudaRunner:
    def __init__(self, artifact_dir: str | Path, kv_budget: int | None = None, kv_fraction: float = 0.9,
                 device: str = "cuda", ops: str = "kernels", cuda_graphs: bool = True,
                 graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                 max_model_len: int | None = None, quantization: str | None = None,
                 dtype: torch.dtype = torch.float16):
        if quantization is not None and quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantization!r} (fp8, or none: the artifact's own weights)")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be torch.float16 or torch.float32, got {dtype}")
        if dtype != torch.float16 and (ops == "kernels" or quantization is not None):
            raise ValueError("dtype=torch.float32 runs the torch references only (ops='reference', no quantization): "
                             "the kernels take fp16 activations")
        self.device = torch.device(device)
        self.dtype = dtype
        lm, art = load_artifact_model(artifact_dir, backend="cuda", device=device, dtype=dtype)
        cfg = self.config = lm.config
        fmt = artifact_format(art)
        kind = fmt.kind  # load_artifact_model refused what has no GPU path (W4A4)
        if fmt.online_hadamard:
            raise ValueError(f"{artifact_dir}: its format rotates down_proj's input at run time (online Hadamard), "
                             "which the CUDA runner does not do; use the reference backend")
        # per layer, the k bias kept outside the KV4 cache (design §3.4), else None: the fused qkv GEMM leaves
        # it out, so the pages get R(p)·x·W_kᵀ, and attention adds R(p)·b back on read
        self.k_bias = outside_k_biases(lm.layers, fmt)
        # W8A8 and W4A16 run their executor modules / dequantized weights on the float path's loop
        self.quantized = kind == "w4a8"
        if quantization is not None and kind != "w16a16":
            raise ValueError(f"quantization={quantization!r} quantizes an fp16 artifact at load; "
                             f"{artifact_dir} already holds {kind.upper()} weights")
        self.quantization = quantization
        self.kv4 = fmt.kv_bits == 4
        self.ops = KernelOps() if ops == "kernels" else ReferenceOps(dtype)
        self.hq, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        kernel = ops == "kernels" and self.device.type == "cuda"
        self.layers = [_Layer(b, self.quantized, quantization == "fp8", kernel, kind) for b in lm.layers]
        for layer, b in zip(self.layers, self.k_bias):
            if b is not None:
                layer.drop_k_bias(self.hq * self.d, self.hkv * self.d)
        self.embed_w, self.norm_w, self.head_w = lm.model.embed_tokens.weight, lm.model.norm.weight, lm.lm_head.weight
        self.eps = lm.model.norm.eps
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        # whole pages of positions: a decode graph's max_seq_len (its page bucket) may pass max_model_len, and
        # the k-bias decode checks its RoPE tables against it
        pages = -(-self.max_model_len // ref.PAGE_TOKENS)
        self.cos, self.sin = rope_tables(lm.model.rotary.inv_freq, pages * ref.PAGE_TOKENS, device)
        del lm
        if kv_budget is None:
            if self.device.type != "cuda":
                raise ValueError("give kv_budget (bytes) off the GPU")
            # the weights freed above (unfused, or fp16 ones quantized to fp8) sit in torch's cache, which
            # mem_get_info counts as used
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info(self.device)
            kv_budget = max(0, int(free * kv_fraction) - ACTIVATION_RESERVE)
        self.cache = kv_cache(cfg, self.kv4, kv_budget, dtype, device)
        self.num_pages = self.cache.num_pages
        self.scratch_page = self.num_pages - 1  # the BlockManager never hands it out
        self.graphs = None
        if cuda_graphs and self.device.type == "cuda" and kind != "w8a8":  # its quantizer copies host tensors
            from qoq.engine.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self, graph_batch_sizes)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    # -- attention -----------------------------------------------------------------------------
    def _write_kv(self, i: int, qkv: torch.Tensor, positions, slots) -> torch.Tensor:
        """RoPE, K/V to the pages; -> q [T, Hq, D]."""
        if self.kv4:
            q, _ = self.ops.rope_kv4_write(qkv, positions, slots, self.cos, self.sin, self.cache.k_pages(i),
                                           self.cache.v_pages(i), self.hq, self.hkv)
            return q
        return self.ops.rope_kv_write_fp16(qkv, positions, slots, self.cos, self.sin, *self.cache.pools(i), self.hq,
                                           self.hkv)

    def _decode_attention(self, i: int, q, page_table, seq_lens, max_seq_len: int) -> torch.Tensor:
        """q [B, Hq, D], page_table int32 [B, P], seq_lens int32 [B] -> [B, Hq, D] (static shapes)."""
        if self.kv4:
            extra = {} if self.k_bias[i] is None else {"k_bias": (self.k_bias[i], self.cos, self.sin)}
            return self.ops.decode_attention(q, self.cache.k_pages(i), self.cache.v_pages(i), page_table, seq_lens,
                                             max_seq_len, **extra)
        return self.ops.decode_attention_fp16(q, *self.cache.pools(i), page_table, seq_lens, max_seq_len)

    def _context(self, i: int, plan: PrefillInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefill chunks' cached K/V (plan.context_slots) -> k, v [Tk, Hkv, D] in the activations' dtype."""
        if not self.kv4:
            return self.cache.gather(i, plan.context_slots)
        k, v = self.ops.read_kv4_slots(self.cache.k_pages(i), self.cache.v_pages(i), plan.context_page,
                                       plan.context_offset, self.hkv, self.d)
        if self.k_bias[i] is not None:
            k = k + ref.rotated_k_bias(self.k_bias[i], plan.context_positions, self.cos, self.sin).to(k.dtype)
        return k, v

    def _prefill_attention(self, i: int, q: torch.Tensor, plan: PrefillInputs | None, singles) -> torch.Tensor:
        """Chunks of one token (decodes in a mixed batch) through decode attention, as in decode steps
        (so a sequence's numbers do not depend on what it is batched with); longer chunks together over
        their contexts read back from the pages (prefill_inputs.py)."""
        if singles is None and plan.q_rows is None:
            return self.ops.chunk_attention(q, *self._context(i, plan), plan)
        out = torch.empty_like(q)
        if singles is not None:
            rows, table, lens, max_len = singles
            out[rows] = self._decode_attention(i, q[rows], table, lens, max_len)
        if plan is not None:
            out[plan.q_rows] = self.ops.chunk_attention(q[plan.q_rows], *self._context(i, plan), plan)
        return out

    # -- the layer loop ------------------------------------------------------------------------
    # h is the residual stream; `delta`, the output of the sublayer ahead (o_proj or down) not yet added to it,
    # is added by the next norm kernel, in place (vLLM's fused_add_rms_norm): None before the first block.
    def _norm_linear(self, h: torch.Tensor, delta, weight: torch.Tensor, eps: float, linear) -> torch.Tensor:
        """linear(RMSNorm(h)), h += delta first."""
        x, residual = (h, None) if delta is None else (delta, h)
        if not self.quantized:
            return linear(self.ops.rmsnorm_fp16(x, weight, eps, residual))
        tiles = self.ops.tiles_for(h.shape[0], linear.group_size)
        return self.ops.gemm(linear, *self.ops.rmsnorm_quant(x, weight, eps, linear.sums, tiles, residual))

    def _mlp_and_o(self, L: _Layer, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """o_proj, h += its output, the MLP; -> the MLP's output (not yet added to h)."""
        t = h.shape[0]
        attn = attn.reshape(t, self.hq * self.d)
        ops = self.ops
        if not self.quantized:
            gu = self._norm_linear(h, L.o(attn), L.ln2, L.eps, L.gate_up)
            return L.down(ops.silu_mul_fp16(gu[:, : L.intermediate], gu[:, L.intermediate :]))
        o = ops.gemm(L.o, *ops.quant_tokens(attn, L.o.sums, ops.tiles_for(t, L.o.group_size)))
        gu = self._norm_linear(h, o, L.ln2, L.eps, L.gate_up)
        act = ops.silu_mul_quant(gu[:, : L.intermediate], gu[:, L.intermediate :], L.down.sums,
                                 ops.tiles_for(t, L.down.group_size))
        return ops.gemm(L.down, *act)

    def _logits(self, h: torch.Tensor, delta, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The final norm of h += delta, then lm_head (at `rows` only, when given)."""
        x, residual = (h, None) if delta is None else (delta, h)
        x = self.ops.rmsnorm_fp16(x, self.norm_w, self.eps, residual)
        return F.linear(x if rows is None else x[rows], self.head_w)

    def decode_forward(self, ids, positions, slots, page_table, seq_lens, max_seq_len: int) -> torch.Tensor:
        """One token per sequence, static shapes (what a CUDA graph captures): ids/positions/slots int64
        [B], page_table int32 [B, P], seq_lens int32 [B] -> logits [B, V] in the activations' dtype."""
        h, delta = F.embedding(ids, self.embed_w), None
        for i, L in enumerate(self.layers):
            q = self._write_kv(i, self._norm_linear(h, delta, L.ln1, L.eps, L.qkv), positions, slots)
            delta = self._mlp_and_o(L, h, self._decode_attention(i, q, page_table, seq_lens, max_seq_len))
        return self._logits(h, delta)

    @torch.inference_mode()
    def forward(self, step: StepInput, return_all_logits: bool = False) -> torch.Tensor:
        """-> logits fp32 [num_seqs, V] at each sequence's last token of the step, or with
        `return_all_logits` at every token [T, V] (scoring: `LLMEngine.prompt_logits`; the serving path
        never sets it). A decode step has one token per sequence, so both are the same rows."""
        if step.is_decode:
            if self.graphs is not None:
                logits = self.graphs.run(step)
                if logits is not None:
                    return logits
            return self.decode_forward(*self.decode_inputs(step)).float()
        dev = self.device
        ids, positions, slots = (torch.tensor(x, dtype=torch.int64).to(dev, non_blocking=True)
                                 for x in (step.token_ids, step.positions, step.slots))
        plan = prefill_inputs(step, dev)
        singles = None
        one = [j for j, c in enumerate(step.chunks) if c.num_tokens == 1]
        if one:
            last = step.last_rows
            rows = torch.tensor([last[j] for j in one], dtype=torch.int64).to(dev)
            singles = (rows, *self._tables(step, one))
        h, delta = F.embedding(ids, self.embed_w), None
        for i, L in enumerate(self.layers):
            q = self._write_kv(i, self._norm_linear(h, delta, L.ln1, L.eps, L.qkv), positions, slots)
            delta = self._mlp_and_o(L, h, self._prefill_attention(i, q, plan, singles))
        if return_all_logits:
            return self._logits(h, delta).float()
        rows = torch.tensor(step.last_rows, dtype=torch.int64).to(dev, non_blocking=True)
        return self._logits(h, delta, rows).float()

    def decode_inputs(self, step: StepInput, batch: int | None = None, width: int | None = None):
        """The decode tensors of a step, padded to `batch` rows and `width` pages with the scratch page:
        (ids, positions, slots, page_table, seq_lens, max_seq_len), decode_forward's arguments."""
        n = len(step.chunks)
        width = width or (step.page_table.shape[1] if step.page_table is not None
                          else max(len(c.pages) for c in step.chunks))
        inputs = DecodeInputs(batch or n, width, self.scratch_page, self.device)
        inputs.fill(step)
        return (*inputs.tensors, inputs.max_seq_len)

    def _tables(self, step: StepInput, rows: list[int]):
        """The page table and seq_lens of chunks `rows` of a step: (int32 [len(rows), width], int32
        [len(rows)], width * 64) on the device, past each chunk's pages the scratch page."""
        chunks = [step.chunks[r] for r in rows]
        lens = torch.tensor([c.context_len for c in chunks], dtype=torch.int32)
        width = max(len(c.pages) for c in chunks)  # these chunks' own: decode attention's split plan
        if step.page_table is not None:
            table = torch.from_numpy(step.page_table[rows, :width])
        else:
            table = torch.full((len(rows), width), self.scratch_page, dtype=torch.int32)
            for r, c in enumerate(chunks):
                table[r, : len(c.pages)] = torch.tensor(c.pages, dtype=torch.int32)
        dev = self.device
        return table.to(dev), lens.to(dev), table.shape[1] * ref.PAGE_TOKENS
