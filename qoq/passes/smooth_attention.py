"""SmoothAttention (QServe §4.2, docs/design.md §3.6): move post-RoPE key outlier channels into the queries.

K is quantized to 4 bits per token and head after RoPE; a few large key channels stretch that range.
Scaling query rows by λ and key rows by 1/λ keeps every q·k, and Q is never quantized. RoPE rotates
channel i together with i + D/2, so λ is made equal on each such pair: then diag(λ) commutes with the
rotation and the scaling folds into W_q and W_k exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.models.rope import apply_rope
from qoq.passes.base import PASSES, BlockContext, Pass

CHUNK = 4  # calibration samples per forward
KEY_FLOOR = 1e-5  # a channel that never fires gets λ = floor^α instead of 0 (no division by zero)


@dataclass(frozen=True)
class SmoothAttentionOptions:
    alpha: float = 0.5  # λ_c = max|K_c|^alpha

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"smooth_attention alpha must lie in [0, 1], got {self.alpha}")


def key_abs_max(block: torch.nn.Module, inputs: torch.Tensor, position_ids: torch.Tensor,
                without_bias: bool = False) -> torch.Tensor:
    """max over calibration tokens of |RoPE(k_proj(input_layernorm(h)))|: [H_kv, D] fp32, on the inputs' device.
    without_bias: of the keys less their k bias, the part a cache with format.k_bias_outside_cache holds
    (a Qwen2 bias of hundreds would otherwise set λ for channels whose cached values are small)."""
    attn = block.self_attn
    bias = attn.k_proj.bias if without_bias else None
    cos, sin = attn.rotary.cos_sin(position_ids)
    k_max = torch.zeros(attn.num_kv_heads, attn.head_dim, device=inputs.device)
    with torch.inference_mode():
        for i in range(0, len(inputs), CHUNK):
            h = inputs[i : i + CHUNK]  # [B, T, H]
            k = attn.k_proj(block.input_layernorm(h))  # [B, T, H_kv * D]
            if bias is not None:
                k = k - bias
            k = k.view(*k.shape[:2], attn.num_kv_heads, attn.head_dim).transpose(1, 2)  # [B, H_kv, T, D]
            k = apply_rope(k, cos, sin)
            k_max = torch.maximum(k_max, k.abs().float().amax(dim=(0, 2)))
    return k_max


def paired_scales(k_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """λ [H_kv, D] with λ_i = λ_{i+D/2} = max(m_i, m_{i+D/2})^α (the pair RoPE rotates together)."""
    half = k_max.shape[-1] // 2
    pair_max = torch.maximum(k_max[:, :half], k_max[:, half:])  # [H_kv, D/2]
    lam = pair_max.clamp_min(KEY_FLOOR).pow(alpha)
    return torch.cat((lam, lam), dim=-1)


def fold_scales(attn: torch.nn.Module, lam: torch.Tensor) -> None:
    """W_q rows × λ (each q head uses its KV head's λ, GQA), W_k rows ÷ λ; biases too."""
    group = attn.num_heads // attn.num_kv_heads
    q_scale = lam.repeat_interleave(group, dim=0).reshape(-1)  # [H_q * D], q head h -> KV head h // group
    k_scale = lam.reshape(-1)  # [H_kv * D]
    with torch.no_grad():
        for linear, scale in ((attn.q_proj, q_scale), (attn.k_proj, 1.0 / k_scale)):
            scale = scale.to(linear.weight.device)
            linear.weight.mul_(scale[:, None].to(linear.weight.dtype))
            if linear.bias is not None:
                linear.bias.mul_(scale.to(linear.bias.dtype))


@PASSES.register("smooth_attention")
class SmoothAttention(Pass):
    name = "smooth_attention"
    needs_calibration = True
    exact = True
    Options = SmoothAttentionOptions

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        attn = block.self_attn
        if attn.head_dim % 2:
            raise ValueError(f"smooth_attention needs an even head_dim for RoPE pairs, got {attn.head_dim}")
        fmt = ctx.recipe.format
        k_max = key_abs_max(block, ctx.inputs, ctx.position_ids,  # [H_kv, D]
                            without_bias=fmt.kv_bits == 4 and fmt.k_bias_outside_cache)
        lam = paired_scales(k_max, self.options.alpha)
        fold_scales(attn, lam)
        return {
            "alpha": self.options.alpha,
            "lambda_min": lam.min().item(),
            "lambda_median": lam.median().item(),
            "lambda_max": lam.max().item(),
            "key_abs_max": k_max.max().item(),
        }
