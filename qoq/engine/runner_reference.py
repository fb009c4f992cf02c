"""The CPU (reference) runner: one forward over a batch of sequence chunks, on the executor's reference
model (integer-exact IntegerLinear W4A8, fp32 elsewhere), so its numbers are those `qoq eval` measures.

K (after RoPE) and V go to paged caches: KV4 pages through attention_reference's write_kv4 / read_kv4
for kv_bits = 4 (quantize_kv: the executor's fake_quant_kv, stored; with format.k_bias_outside_cache, K
less its rotated k bias, added back on read), fp32 pages for the fp16 artifact
(so greedy tokens equal HF's fp32 generate). Every chunk attends over its sequence's cached tokens,
read back from the pages, prefill and decode alike: chunked prefill and recomputation see the same K/V.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from qoq.engine.batch import StepInput
from qoq.engine.model_loading import artifact_format, kv_cache, outside_k_biases, rope_tables
from qoq.executor.build import load_artifact_model
from qoq.quant.kv import dequantize_kv
from qoq.runtime_cuda import attention_reference as ref


class ReferenceRunner:
    def __init__(self, artifact_dir: str | Path, kv_budget: int, device: str = "cpu"):
        self.lm, self.artifact = load_artifact_model(artifact_dir, backend="reference", device=device,
                                                     dtype=torch.float32)
        cfg = self.config = self.lm.config
        self.device = torch.device(device)
        fmt = artifact_format(self.artifact)
        self.kv4 = fmt.kv_bits == 4
        self.k_bias = outside_k_biases(self.lm.layers, fmt)  # per layer, None where the cache holds it
        for block in self.lm.layers:
            block.self_attn.kv_quant = None  # the runner stores (and for KV4 quantizes) K/V itself
        self.max_model_len = cfg.max_position_embeddings
        self.cos, self.sin = rope_tables(self.lm.model.rotary.inv_freq, self.max_model_len, device)
        self.cache = kv_cache(cfg, self.kv4, kv_budget, torch.float32, device)
        self.num_pages = self.cache.num_pages

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor) -> None:
        if self.kv4:
            if self.k_bias[layer] is not None:
                k = k - ref.rotated_k_bias(self.k_bias[layer], positions, self.cos, self.sin)
            ref.write_kv4(self.cache.k_pages(layer), k, slots)
            ref.write_kv4(self.cache.v_pages(layer), v, slots)
        else:
            self.cache.write(layer, k, v, slots)

    def _read(self, layer: int, pages: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> k, v fp32 [H_kv, L, D]."""
        if not self.kv4:
            return self.cache.read(layer, pages, length)
        h, d = self.config.num_kv_heads, self.config.head_dim
        k, v = (dequantize_kv(*ref.read_kv4(pool, pages, length, h, d), dtype=torch.float32)
                for pool in (self.cache.k_pages(layer), self.cache.v_pages(layer)))
        if self.k_bias[layer] is not None:  # a sequence's cached tokens sit at positions 0..length-1
            k = k + ref.rotated_k_bias(self.k_bias[layer], torch.arange(length, device=k.device), self.cos,
                                       self.sin).transpose(0, 1)
        return k, v

    def _attention(self, layer: int, q: torch.Tensor, step: StepInput, pages: list[torch.Tensor]) -> torch.Tensor:
        """q [T, Hq, D] -> [T, Hq, D]: each chunk over its sequence's cached K/V (causal)."""
        out = torch.empty_like(q)
        group = self.config.num_heads // self.config.num_kv_heads
        lo = 0
        for chunk, page_ids in zip(step.chunks, pages):
            hi = lo + chunk.num_tokens
            k, v = self._read(layer, page_ids, chunk.context_len)
            if group > 1:
                k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            qc = q[lo:hi].transpose(0, 1)[None]  # [1, Hq, Tq, D]
            if chunk.start == 0:  # the whole prompt: the executor's own call
                o = F.scaled_dot_product_attention(qc, k[None], v[None], is_causal=True)
            elif chunk.num_tokens == 1:  # a decode: the decode kernel's fp32 reference, not SDPA, whose
                # CPU kernel sums in another order on some CPUs: one ulp there flips a code downstream
                o = ref.softmax_attention(qc[0], k, v, 1 / math.sqrt(qc.shape[-1]), causal=False)[None]
            else:
                key_pos = torch.arange(chunk.context_len, device=q.device)
                query_pos = torch.arange(chunk.start, chunk.context_len, device=q.device)
                mask = key_pos[None, :] <= query_pos[:, None]
                o = F.scaled_dot_product_attention(qc, k[None], v[None], attn_mask=mask)
            out[lo:hi] = o[0].transpose(0, 1)
            lo = hi
        return out

    @torch.inference_mode()
    def forward(self, step: StepInput, return_all_logits: bool = False) -> torch.Tensor:
        """-> logits fp32 [num_seqs, V] at each sequence's last token of the step ([T, V], every token,
        with `return_all_logits`)."""
        cfg = self.config
        dev = self.device
        ids = torch.tensor(step.token_ids, dtype=torch.int64, device=dev)
        positions = torch.tensor(step.positions, dtype=torch.int64, device=dev)
        slots = torch.tensor(step.slots, dtype=torch.int64, device=dev)
        pages = [torch.tensor(c.pages, dtype=torch.int64, device=dev) for c in step.chunks]
        t = ids.shape[0]
        h = self.lm.embed(ids)  # [T, H]
        for i, block in enumerate(self.lm.layers):
            attn = block.self_attn
            x = block.input_layernorm(h)
            q = attn.q_proj(x).view(t, cfg.num_heads, cfg.head_dim)
            k = attn.k_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim)
            v = attn.v_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim)
            q, k = ref.apply_rope(q, positions, self.cos, self.sin), ref.apply_rope(k, positions, self.cos, self.sin)
            self._write(i, k, v, slots, positions)
            o = self._attention(i, q, step, pages)
            h = h + attn.o_proj(o.reshape(t, cfg.num_heads * cfg.head_dim))
            h = h + block.mlp(block.post_attention_layernorm(h))
        if return_all_logits:
            return self.lm.head(h).float()
        rows = torch.tensor(step.last_rows, dtype=torch.int64, device=dev)
        return self.lm.head(h[rows]).float()
