"""AWQ (Lin et al. 2024) as a pass for the W4A16 format: activation-aware scaling, then clipping.

Scaling: for each block input that can absorb a scale (input_scaling.py: q/k/v, gate/up, down), s_j =
mean|X_j|^α (normalized by sqrt(max s · min s)), α ∈ {0, 1/grid, ..., (grid-1)/grid} searched by the
calibration output error Σ_readers ‖X·Wᵀ − X·(Q(W·diag s)·diag s⁻¹)ᵀ‖² (Q: the recipe's W4 groups), then
folded (exact in float). AWQ scores the output of the whole attention / MLP; this pass scores the
linears' own outputs. o_proj is not scaled (AWQ scales it through v_proj only without GQA).

Clipping: per row and per group of g input channels, a ratio r of the group's range, searched on a grid
from 1 down to min_clip by the group's own output error ‖X_g·ΔW_gᵀ‖² (cross-group terms ignored, as
AWQ does), for every linear but q_proj and k_proj (which AWQ leaves unclipped).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.models.llama import BLOCK_LINEARS
from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import SHARED_INPUT, OutputError, capture_linear_inputs
from qoq.passes.input_scaling import SCALABLE_INPUTS, fold_input_scales, reader_weights
from qoq.quant.asymmetric import quantize_asymmetric

UNCLIPPED = ("self_attn.q_proj", "self_attn.k_proj")
SCALE_FLOOR = 1e-4


@dataclass(frozen=True)
class AWQOptions:
    grid: int = 20  # α candidates of the scale search
    clip: bool = True
    clip_grid: int = 20  # clip ratios from 1.0 down to min_clip
    min_clip: float = 0.5
    max_tokens: int = 4096  # calibration tokens (seeded subsample)

    def __post_init__(self):
        if self.grid < 1 or self.clip_grid < 1 or not 0 < self.min_clip <= 1 or self.max_tokens < 1:
            raise ValueError(f"awq options need grid >= 1, clip_grid >= 1, 0 < min_clip <= 1, max_tokens >= 1; got {self}")


def awq_scales(x_mean: torch.Tensor, alpha: float) -> torch.Tensor:
    s = x_mean.pow(alpha).clamp_min(SCALE_FLOOR)
    return s / (s.max() * s.min()).sqrt()


def scaled_error(weights: list[torch.Tensor], s: torch.Tensor, error: OutputError, group_size: int) -> float:
    """Σ over readers of ‖X·(W − Q(W·s)/s)ᵀ‖²."""
    return sum(error(w - quantize_asymmetric(w * s[None, :], group_size).dequantize() / s[None, :]).sum().item()
               for w in weights)


def search_group_clip(weight: torch.Tensor, x: torch.Tensor, group_size: int, ratios: torch.Tensor
                      ) -> tuple[torch.Tensor, float, float]:
    """Best ratio [N, G] per row and group of weight [N, K] on tokens x [M, K] (earlier ratios win ties);
    returns it and the summed per-group errors at ratio 1 and at the choice."""
    n, k = weight.shape
    g = k if group_size == -1 else group_size
    xg = x.view(-1, k // g, g).transpose(0, 1)  # [G, M, g]
    gram = xg.transpose(1, 2) @ xg  # [G, g, g]: the diagonal blocks of XᵀX
    best_r, best_e, first = None, None, None
    for r in ratios.tolist():
        delta = (weight - quantize_asymmetric(weight, group_size, torch.full((n, k // g), r, device=weight.device)).dequantize()).view(n, k // g, g)
        e = torch.einsum("ngk,gkl,ngl->ng", delta, gram, delta)  # [N, G]
        if best_e is None:
            best_r, best_e, first = torch.full_like(e, r), e, e
        else:
            better = e < best_e
            best_r, best_e = torch.where(better, r, best_r), torch.where(better, e, best_e)
    return best_r, first.sum().item(), best_e.sum().item()


@PASSES.register("awq")
class AWQ(Pass):
    name = "awq"
    needs_calibration = True
    exact = False  # the scaling keeps the float function; the clip ratios change what the quantizer does
    Options = AWQOptions
    formats = ("w4a16",)

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        o, group = self.options, ctx.recipe.format.group_size
        inputs = capture_linear_inputs(block, ctx, o.max_tokens)  # {owner: [M, K]}
        record = {"scales": {}, "clip": {}}
        for owner in SCALABLE_INPUTS:
            x = inputs[owner]
            weights, error = reader_weights(block, owner), OutputError(x)
            x_mean = x.abs().mean(dim=0)
            table = {a / o.grid: scaled_error(weights, awq_scales(x_mean, a / o.grid), error, group)
                     for a in range(o.grid)}
            alpha = min(table, key=table.get)
            s = awq_scales(x_mean, alpha)
            signal = sum(error(w).sum().item() for w in weights)
            record["scales"][owner] = {"alpha": alpha, "rel_err_before": (table[0.0] / signal) ** 0.5,
                             "rel_err_after": (table[alpha] / signal) ** 0.5}
            fold_input_scales(block, owner, s)
            inputs[owner] = x / s[None, :]  # what the scaled linears now read
        if o.clip:
            ratios = torch.linspace(1.0, o.min_clip, o.clip_grid) if o.clip_grid > 1 else torch.ones(1)
            for name in BLOCK_LINEARS:
                if name in UNCLIPPED:
                    continue
                weight = block.get_submodule(name).weight.detach().float()
                ratio, before, after = search_group_clip(weight, inputs[SHARED_INPUT[name]], group, ratios)
                ctx.clip_ratios[name] = ratio
                record["clip"][name] = {"ratio_mean": ratio.mean().item(), "err_before": before, "err_after": after}
        scaled = record["scales"].values()
        record["rel_err_before"] = sum(r["rel_err_before"] for r in scaled) / len(scaled)  # the progress row
        record["rel_err_after"] = sum(r["rel_err_after"] for r in scaled) / len(scaled)
        return record
