"""The kernels the CUDA runner calls, behind one small interface: `KernelOps` (the CUDA wrappers of
qoq.runtime_cuda) or `ReferenceOps` (their pure-torch references, same contracts, any device), so the
runner's data flow is tested on the CPU and its numbers on the GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qoq.quant.kv import dequantize_kv
from qoq.runtime_cuda import attention_reference, reference


class ReferenceOps:
    """`dtype`: the activations' dtype. float16 is the kernels' contract; float32 keeps every value the
    kernels round to fp16 (norm and MLP outputs before their quantization, GEMM outputs, q/k/v before RoPE
    and KV4) in fp32, which makes the CUDA runner's data flow compute the reference runner's numbers."""

    tiled = False

    def __init__(self, dtype: torch.dtype = torch.float16):
        self.dtype = dtype

    def tiles_for(self, m: int, group: int) -> bool:
        return False

    def rmsnorm_quant(self, x, weight, eps, sums, tiles, residual=None):
        return reference.reference_rmsnorm_quant(x, weight, eps, sums, self.dtype, residual)

    def quant_tokens(self, x, sums, tiles):
        return reference.reference_quant(x, sums)

    def silu_mul_quant(self, gate, up, sums, tiles):
        return reference.reference_silu_mul_quant(gate, up, sums, self.dtype)

    def rmsnorm_fp16(self, x, weight, eps, residual=None):
        return reference.rmsnorm_fp16(x, weight, eps, self.dtype, residual)

    def silu_mul_fp16(self, gate, up):
        return reference.silu_mul_fp16(gate, up, self.dtype)

    def gemm(self, linear, qx, s_x, sums):
        return reference.reference_gemm(
            qx, s_x, linear.qweight, linear.s1_scales, s2_scales=linear.s2_scales, s2_zeros=linear.s2_zeros,
            s1_szeros=linear.s1_szeros, xsum=sums if linear.per_channel else None, bias=linear.bias,
            out_dtype=self.dtype)

    def rope_kv4_write(self, qkv, positions, slots, cos, sin, k_pages, v_pages, hq, hkv):
        return attention_reference.rope_kv4_write(qkv, positions, slots, cos, sin, k_pages, v_pages, hq, hkv)

    def rope_kv_write_fp16(self, qkv, positions, slots, cos, sin, k_pool, v_pool, hq, hkv):
        return attention_reference.rope_kv_write_fp16(qkv, positions, slots, cos, sin, k_pool, v_pool, hq, hkv)

    def decode_attention(self, q, k_pages, v_pages, page_table, seq_lens, max_seq_len, k_bias=None):
        return attention_reference.decode_attention(q, k_pages, v_pages, page_table, seq_lens, k_bias=k_bias)

    def decode_attention_fp16(self, q, k_pool, v_pool, page_table, seq_lens, max_seq_len):
        return attention_reference.decode_attention_fp16(q, k_pool, v_pool, page_table, seq_lens)

    def read_kv4_slots(self, k_pages, v_pages, page, offset, hkv, d):
        return tuple(dequantize_kv(*attention_reference.read_kv4_slots(pool, page, offset, hkv, d), dtype=self.dtype)
                     for pool in (k_pages, v_pages))

    def chunk_attention(self, q, k, v, plan):
        """Per chunk, SDPA under an explicit bottom-right causal mask (the reference runner's own call)."""
        out = torch.empty_like(q)
        qlo = klo = 0
        for q_len, k_len in zip(plan.q_lens, plan.k_lens):
            qhi, khi = qlo + q_len, klo + k_len
            kc, vc = (x[klo:khi].transpose(0, 1).contiguous()[None] for x in (k, v))
            keys = torch.arange(k_len, device=q.device)
            mask = keys[None, :] <= torch.arange(k_len - q_len, k_len, device=q.device)[:, None]
            o = F.scaled_dot_product_attention(q[qlo:qhi].transpose(0, 1)[None], kc, vc, attn_mask=mask,
                                               enable_gqa=True)
            out[qlo:qhi] = o[0].transpose(0, 1)
            qlo, klo = qhi, khi
        return out


class KernelOps:
    """The CUDA kernels (imported on construction: needs a GPU and builds the extensions)."""

    def __init__(self):
        from qoq.runtime_cuda import attention, gemm, quant_kernels

        self._attention, self._gemm, self._quant = attention, gemm, quant_kernels
        self._rope_fragments = {}  # (cos, sin, head_dim) of the runner's RoPE tables -> the k-bias mma's table

    def tiles_for(self, m: int, group: int) -> bool:
        return self._gemm.tiles_for(m, group)

    def rmsnorm_quant(self, x, weight, eps, sums, tiles, residual=None):
        return self._quant.rmsnorm_quant(x, weight, eps, sums=sums, tiles=tiles, residual=residual)

    def quant_tokens(self, x, sums, tiles):
        return self._quant.quant_tokens(x, sums=sums, tiles=tiles)

    def silu_mul_quant(self, gate, up, sums, tiles):
        return self._quant.silu_mul_quant(gate, up, sums=sums, tiles=tiles)

    # the fp16 path's row kernels and RoPE write follow cuBLAS GEMMs: as programmatic dependents they are
    # launched while the GEMM ends, and wait for it before reading anything
    def rmsnorm_fp16(self, x, weight, eps, residual=None):
        return self._quant.rmsnorm_fp16(x, weight, eps, residual=residual, enable_pdl=True)

    def silu_mul_fp16(self, gate, up):
        return self._quant.silu_mul_fp16(gate, up, enable_pdl=True)

    def gemm(self, linear, qx, s_x, sums):
        return linear.forward_quantized(qx, s_x, sums)  # W4A8 GEMM, a programmatic dependent of the quant

    def rope_kv4_write(self, qkv, positions, slots, cos, sin, k_pages, v_pages, hq, hkv):
        return self._attention.rope_kv4_write(qkv, positions, slots, cos, sin, k_pages, v_pages, hq, hkv)

    def rope_kv_write_fp16(self, qkv, positions, slots, cos, sin, k_pool, v_pool, hq, hkv):
        return self._attention.rope_kv_write_fp16(qkv, positions, slots, cos, sin, k_pool, v_pool, hq, hkv,
                                                  enable_pdl=True)

    def decode_attention(self, q, k_pages, v_pages, page_table, seq_lens, max_seq_len, k_bias=None):
        if k_bias is not None:  # made once, on the eager runs before any graph capture
            b, cos, sin = k_bias
            key = (cos.data_ptr(), sin.data_ptr(), q.shape[-1])
            if key not in self._rope_fragments:
                self._rope_fragments[key] = self._attention.rope_fragments(cos, sin, q.shape[-1])
            k_bias = (b, cos, sin, self._rope_fragments[key])
        # enable_pdl: starts while rope_kv4_write (just ahead, writing q and the new token) ends
        return self._attention.decode_attention(q, k_pages, v_pages, page_table, seq_lens, max_seq_len,
                                                enable_pdl=True, k_bias=k_bias)

    def decode_attention_fp16(self, q, k_pool, v_pool, page_table, seq_lens, max_seq_len):
        return self._attention.decode_attention_fp16(q, k_pool, v_pool, page_table, seq_lens, max_seq_len)

    def read_kv4_slots(self, k_pages, v_pages, page, offset, hkv, d):
        return self._attention.read_kv4_slots(k_pages, v_pages, page, offset, hkv, d)

    def chunk_attention(self, q, k, v, plan):
        return self._attention.chunk_attention(q, k, v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k)


def fuse_w4a8(linears):
    """Concatenate W4A8 linears sharing an input along N (q|k|v, gate|up): qweight rows are 32-row tiles
    and s2 is interleaved within 32 columns, so the artifact layout concatenates as is."""
    from qoq.runtime_cuda.linear import CudaW4A8Linear

    def cat(name, dim):
        parts = [getattr(m, name) for m in linears]
        return None if parts[0] is None else torch.cat(parts, dim)

    biases = [m.bias for m in linears]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else torch.zeros(m.out_features, dtype=torch.float16, device=m.qweight.device)
                          for b, m in zip(biases, linears)])
    return CudaW4A8Linear(cat("qweight", 0), cat("s1_scales", 0), cat("s2_scales", 1), cat("s2_zeros", 1),
                          cat("s1_szeros", 0), bias)
