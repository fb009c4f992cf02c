"""Offline rotation (QuaRot-style, as QServe applies it; docs/design.md §3.6): the residual stream is rotated
by an orthogonal R so activation outlier channels are spread over all channels before A8 quantization.

RMSNorm commutes with R once its γ is folded into the linears it feeds (γ := 1; the norm stays applied):
rms(h·R) = rms(h). Then E ← E·R; q/k/v/gate/up and lm_head W ← W·R; o/down W ← Rᵀ·W, b ← b·R.
A per-head Hadamard H_D on v_proj's output rows, undone on o_proj's input columns, spreads V outliers
before KV4 (attention mixes tokens, not channels, so it commutes). Online rotation only where the format
asks for it (`online_hadamard`, QuaRot): down_proj's input, rotated by the runtime as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qoq.passes.base import PASSES, BlockContext, ModelContext, Pass
from qoq.quant.hadamard import (
    KroneckerOrthogonal,
    OnlineRotation,
    hadamard,
    hadamard_rotation,
)

NORM_FEEDS = {  # norm -> the linears reading its output (they absorb γ and take W ← W·R)
    "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
}
RESIDUAL_WRITERS = ("self_attn.o_proj", "mlp.down_proj")  # W ← Rᵀ·W, b ← b·R


@dataclass(frozen=True)
class RotationOptions:
    seed: int = 0  # for the random orthogonal fallback when no Hadamard of the size is constructible
    per_head_v: bool = True  # per-head Hadamard on v_proj rows / o_proj columns


def _linear(module: nn.Module, name: str) -> nn.Linear:
    linear = module.get_submodule(name)
    if type(linear) is not nn.Linear:
        raise TypeError(f"rotation needs float nn.Linear modules, but {name} is {type(linear).__name__}: "
                        "run 'rotation' before any quantizing pass")
    return linear


@torch.no_grad()
def _set(param: torch.Tensor, value: torch.Tensor) -> None:
    param.copy_(value.to(param.dtype))


@torch.no_grad()
def _fold_norm(norm: nn.Module, linears: list[nn.Linear]) -> None:
    """W ← W·diag(γ) for every reader of the norm, then γ := 1."""
    gamma = norm.weight  # [H]
    for linear in linears:
        if linear.weight.dtype == gamma.dtype:  # one correctly rounded product: the same as via fp64
            linear.weight.mul_(gamma)
        else:
            _set(linear.weight, linear.weight.double() * gamma.double())
    norm.weight.fill_(1.0)


@PASSES.register("rotation")
class Rotation(Pass):
    name = "rotation"
    needs_calibration = False
    exact = True
    Options = RotationOptions

    def __init__(self, options=None):
        super().__init__(options)
        self.residual: KroneckerOrthogonal | None = None  # R [H, H], set by prepare_model
        self.head: torch.Tensor | None = None  # H_D [D, D] fp64 or None

    def prepare_model(self, lm: nn.Module, ctx: ModelContext) -> dict:
        """Rotate the skeleton: E ← E·R and lm_head ← W·diag(γ_final)·R (untied first)."""
        cfg = ctx.config
        self.residual, residual_kind = hadamard_rotation(cfg.hidden_size, self.options.seed)
        record = {"residual": {"kind": residual_kind, "size": cfg.hidden_size}, "head": None}
        if self.options.per_head_v:
            self.head, head_kind = hadamard(cfg.head_dim, self.options.seed)
            record["head"] = {"kind": head_kind, "size": cfg.head_dim}
        lm.untie_embeddings()
        _fold_norm(lm.model.norm, [lm.lm_head])
        with torch.no_grad():
            for weight in (lm.model.embed_tokens.weight, lm.lm_head.weight):  # [V, H]
                self.residual.right_(weight)
        return record

    @torch.no_grad()
    def apply(self, block: nn.Module, ctx: BlockContext) -> dict:
        if self.residual is None:
            raise RuntimeError("rotation.apply ran before rotation.prepare_model: the model's embeddings "
                               "must be rotated with the same R as its blocks")
        r = self.residual  # R [H, H]
        for norm_name, reader_names in NORM_FEEDS.items():
            readers = [_linear(block, n) for n in reader_names]
            _fold_norm(block.get_submodule(norm_name), readers)
            for linear in readers:  # [N, H]
                _set(linear.weight, r.right(linear.weight))
        for name in RESIDUAL_WRITERS:
            linear = _linear(block, name)  # weight [H, K]
            _set(linear.weight, r.left_transposed(linear.weight))
            if linear.bias is not None:
                _set(linear.bias, r.right(linear.bias))
        if self.head is not None:
            self._rotate_heads(block.self_attn)
        if ctx.recipe.format.online_hadamard:
            return {"online_down": self._rotate_down_online(block.mlp)}
        return {}

    def _rotate_down_online(self, mlp: nn.Module) -> str:
        """W_down ← W_down·R_K and down_proj's input x ← x·R_K at run time (QuaRot): outliers of SiLU·up
        spread over all K channels before per-token quantization. Returns R_K's kind."""
        online = OnlineRotation(mlp.down_proj.in_features)
        down = _linear(mlp, "down_proj")
        _set(down.weight, online.rotation.right(down.weight))
        mlp.down_input_transform = online
        return online.kind

    def _rotate_heads(self, attn: nn.Module) -> None:
        """v_h ← v_h·H_D for each KV head (rows of W_v, and b_v); o_proj's input columns ← ·H_D for every
        query head, which under GQA undoes its KV head's rotation because all heads share H_D."""
        v, o = _linear(attn, "v_proj"), _linear(attn, "o_proj")
        d, h = attn.head_dim, self.head.to(v.weight.device)  # h [D, D], built on the CPU
        w_v = v.weight.double().view(-1, d, v.in_features)  # [H_kv, D, H]
        _set(v.weight, torch.einsum("de,kdi->kei", h, w_v).reshape(v.weight.shape))  # H_Dᵀ·W_v,h
        if v.bias is not None:
            _set(v.bias, (v.bias.double().view(-1, d) @ h).reshape(-1))  # [H_kv·D]
        w_o = o.weight.double().view(o.out_features, -1, d)  # [H, H_q, D]
        _set(o.weight, (w_o @ h).reshape(o.weight.shape))
