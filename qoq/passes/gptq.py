"""GPTQ (Frantar et al. 2022) onto the recipe's W4 format: quantize columns one at a time, in
act-order, pushing each column's rounding error onto the columns not yet quantized through the inverse
Hessian H⁻¹, H = 2XᵀX/n. The grid (s1/s2/z or s/szero, with the clip ratios) is STATIC: computed from
the full float W first, so GPTQ only chooses codes and the result is an ordinary QuantizedWeight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.passes.base import BLOCK_LINEARS, PASSES, BlockContext, Pass
from qoq.passes.capture import SHARED_INPUT, capture_linear_inputs
from qoq.quant.weights import QuantizedWeight, quantize_weight, round_onto_grid

HESSIAN_CHUNK = 1024  # calibration rows per XᵀX partial sum
DAMP_RETRIES = 4  # each retry multiplies the damping by 10
MIN_RETRY_DAMP = 1e-3  # a retry after damp = 0 starts here


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2XᵀX/n [K, K] fp32 from x [n, K], accumulated over row chunks."""
    h = torch.zeros(x.shape[1], x.shape[1], device=x.device)
    for i in range(0, len(x), HESSIAN_CHUNK):
        chunk = x[i : i + HESSIAN_CHUNK]  # [c, K]
        h.addmm_(chunk.T, chunk)
    return h.mul_(2 / max(len(x), 1))


def inverse_cholesky(h: torch.Tensor, damp: float) -> tuple[torch.Tensor, float, int]:
    """Upper Cholesky factor of (H + damp·mean(diag H)·I)⁻¹, raising damp ×10 while a factorization
    fails (a rank-deficient H). Returns (factor [K, K], damp used, retries)."""
    mean_diag = h.diagonal().mean()
    for retry in range(DAMP_RETRIES + 1):
        damped = h.clone()
        damped.diagonal().add_(damp * mean_diag)
        lower, info = torch.linalg.cholesky_ex(damped)
        del damped
        if info == 0:
            upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if info == 0 and torch.isfinite(upper).all():
                return upper, damp, retry
        if retry < DAMP_RETRIES:
            damp = max(10 * damp, MIN_RETRY_DAMP)
    raise RuntimeError(f"Hessian is not positive definite even with damping {damp} after {DAMP_RETRIES} retries")


def gptq_quantize(weight: torch.Tensor, h: torch.Tensor, group_size: int, clip_ratio: torch.Tensor | None = None,
                  damp: float = 0.01, act_order: bool = True, block_size: int = 128
                  ) -> tuple[QuantizedWeight, dict]:
    """GPTQ codes of weight [N, K] on its static grid, given the input Hessian h [K, K].
    Returns the QuantizedWeight and a record (damping, retries, dead columns)."""
    w = weight.detach().float()  # [N, K]
    n, k = w.shape
    if h.shape != (k, k):
        raise ValueError(f"Hessian is {tuple(h.shape)}, the weight has K={k} input channels")
    grid = quantize_weight(w, group_size, clip_ratio)  # the fixed scales, and RTN's codes
    dead = h.diagonal() == 0  # inputs never active in calibration: decoupled, so RTN rounds them
    diag = h.diagonal().masked_fill(dead, 1)
    order = torch.argsort(diag, descending=True, stable=True) if act_order else torch.arange(k, device=w.device)
    w, h = w[:, order], h[order[:, None], order]  # permuted copies
    h.diagonal()[dead[order]] = 1
    hinv, damp_used, retries = inverse_cholesky(h, damp)

    codes = torch.zeros(n, k, dtype=torch.uint8, device=w.device)  # in act-order
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        w_block, hinv_block = w[:, i1:i2].clone(), hinv[i1:i2, i1:i2]  # [N, B], [B, B]
        err_block = torch.zeros_like(w_block)
        for i in range(i2 - i1):
            column = w_block[:, i : i + 1]  # [N, 1]
            q, w_hat = round_onto_grid(column, grid, order[i1 + i : i1 + i + 1])
            codes[:, i1 + i] = q[:, 0]
            err = (column - w_hat) / hinv_block[i, i]  # [N, 1]
            w_block[:, i:] -= err @ hinv_block[i : i + 1, i:]
            err_block[:, i : i + 1] = err
        w[:, i2:] -= err_block @ hinv[i1:i2, i2:]  # lazy batch update of the later columns
    unpermuted = torch.empty_like(codes)
    unpermuted[:, order] = codes
    record = {"damp": damp_used, "retries": retries, "dead_columns": int(dead.sum())}
    return grid.with_codes(unpermuted), record


def output_rel_err(weight: torch.Tensor, qw: QuantizedWeight, h: torch.Tensor) -> float:
    """‖X·Wᵀ − X·Ŵᵀ‖ / ‖X·Wᵀ‖ on the calibration inputs, through H ∝ XᵀX."""
    delta = weight.float() - qw.dequantize()  # [N, K]
    err = ((delta @ h) * delta).sum().clamp_min(0)
    return (err / ((weight.float() @ h) * weight.float()).sum().clamp_min(1e-30)).sqrt().item()


@dataclass(frozen=True)
class GPTQOptions:
    damp: float = 0.01  # relative to mean(diag H)
    act_order: bool = True  # quantize columns by descending diag(H)
    block_size: int = 128  # columns per lazy batch update
    max_tokens: int = 4096  # calibration tokens in H (seeded subsample)


@PASSES.register("gptq")
class GPTQ(Pass):
    name = "gptq"
    quantizes = True
    needs_calibration = True
    exact = False
    Options = GPTQOptions

    def __init__(self, options=None):
        super().__init__(options)
        o = self.options
        if o.damp < 0 or o.block_size < 1 or o.max_tokens < 1:
            raise ValueError(f"gptq options need damp >= 0, block_size >= 1, max_tokens >= 1; got {o}")

    def apply(self, block: torch.nn.Module, ctx: BlockContext) -> dict:
        o, group = self.options, ctx.recipe.format.group_size
        inputs = capture_linear_inputs(block, ctx, o.max_tokens)
        hessians = {owner: hessian(inputs.pop(owner)) for owner in list(inputs)}  # one H per shared input
        record = {}
        for name in BLOCK_LINEARS:
            weight = block.get_submodule(name).weight.detach().float()  # [N, K]
            h, clip = hessians[SHARED_INPUT[name]], ctx.clip_ratios.get(name)
            qw, record[name] = gptq_quantize(weight, h, group, clip, o.damp, o.act_order, o.block_size)
            ctx.quantized[name] = qw
            record[name]["rel_err"] = output_rel_err(weight, qw, h)
            record[name]["rel_err_rtn"] = output_rel_err(weight, quantize_weight(weight, group, clip), h)
        return record
