"""Our own Llama-family decoder (Llama 1/2/3.x, Mistral, Qwen2, SmolLM2).

Module names follow HF, so `state_dict()` keys are HF tensor names. Every linear is only ever called
(`proj(x)`), never reached into, so quantized linears can replace any of them.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from qoq.models.config import ModelConfig
from qoq.models.rope import RotaryTable, apply_rope

KVQuant = Callable[[torch.Tensor], torch.Tensor]  # [B, H_kv, T, D] -> same shape

# A Block's linears (the ones a recipe quantizes) and norms, by name relative to the block
BLOCK_LINEARS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)
BLOCK_NORMS = ("input_layernorm", "post_attention_layernorm")


class RMSNorm(nn.Module):
    """True RMSNorm, y = x * rsqrt(mean(x^2) + eps) * gamma, computed in fp32 and cast back."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * inv_rms * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryTable):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        hidden = config.hidden_size
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, q_width, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, kv_width, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, kv_width, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_width, hidden, bias=config.o_proj_bias)
        self.rotary = rotary
        self.kv_quant: KVQuant | None = None  # applied to post-RoPE K and to V before attention
        # with kv_quant: K is quantized without the k_proj bias, which is added back rotated (recipe_schema)
        self.k_bias_outside_cache = False

    def _heads(self, y: torch.Tensor, n_heads: int) -> torch.Tensor:
        batch, seq, _ = y.shape
        return y.view(batch, seq, n_heads, self.head_dim).transpose(1, 2)  # [B, heads, T, D]

    def rotated_k_bias(self, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """R(p)·b [1, Hkv, T, D] at the positions cos/sin hold, when the k bias stays outside the cache."""
        if not self.k_bias_outside_cache or self.k_proj.bias is None:
            return None
        b = self.k_proj.bias.to(dtype).view(1, self.num_kv_heads, 1, self.head_dim)
        return apply_rope(b.expand(1, self.num_kv_heads, cos.shape[-2], self.head_dim), cos, sin)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape  # [B, T, H]
        q = self._heads(self.q_proj(x), self.num_heads)  # [B, Hq, T, D]
        k = self._heads(self.k_proj(x), self.num_kv_heads)  # [B, Hkv, T, D]
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        cos, sin = self.rotary.cos_sin(position_ids)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_quant is not None:
            bias = self.rotated_k_bias(cos, sin, k.dtype)
            k = self.kv_quant(k) if bias is None else self.kv_quant(k - bias) + bias
            v = self.kv_quant(v)
        group = self.num_heads // self.num_kv_heads
        if group > 1:  # GQA: each KV head serves `group` consecutive query heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, Hq, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        # None, or a callable applied to down_proj's input at run time (an online rotation: x ← x·R,
        # with W_down ← W_down·R already folded, so the MLP computes the same function)
        self.down_input_transform = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        if self.down_input_transform is not None:
            h = self.down_input_transform(h)
        return self.down_proj(h)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryTable | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, rotary or RotaryTable(config))
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, h: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """h [B, T, H], position_ids [T] or [B, T] -> [B, T, H]."""
        h = h + self.self_attn(self.input_layernorm(h), position_ids)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderStack(nn.Module):
    """HF's `model.*` namespace: embeddings, blocks, final norm, and the shared rotary table."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.rotary = RotaryTable(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, self.rotary) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    def position_ids(self, seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.arange(seq_len, device=device)  # [T]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)  # [B, T] -> [B, T, H]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(h))  # [B, T, H] -> [B, T, V]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        position_ids = self.position_ids(input_ids.shape[1], input_ids.device)
        for layer in self.model.layers:
            h = layer(h, position_ids)
        return self.head(h)

    def untie_embeddings(self) -> None:
        """Give lm_head its own copy of the embedding (passes that rotate or quantize it need this)."""
        if not self.config.tie_word_embeddings:
            return
        self.lm_head.weight = nn.Parameter(self.model.embed_tokens.weight.detach().clone())
        self.config.tie_word_embeddings = False
        self.config.hf["tie_word_embeddings"] = False
