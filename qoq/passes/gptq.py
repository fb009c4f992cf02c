"""GPTQ (Frantar et al. 2022) onto the recipe's W4 format: quantize columns one at a time, in
act-order, pushing each column's rounding error onto the columns not yet quantized through the inverse
Hessian H⁻¹, H = 2XᵀX/n. The grid (s1/s2/z or s/szero, with the clip ratios) is STATIC: computed from
the full float W first, so GPTQ only chooses codes and the result is an ordinary QuantizedWeight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.models.llama import BLOCK_LINEARS
from qoq.passes.base import PASSES, BlockContext, Pass
from qoq.passes.capture import SHARED_INPUT, OutputError, capture_linear_inputs
from qoq.quant.formats import AnyWeight, fake_quantize_for_format, quantize_for_format
from qoq.quant.weights import PROTECTIVE_RANGE, QuantizedWeight, quantize_weight

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


@dataclass(frozen=True)
class HessianFactor:
    """What GPTQ needs from one input Hessian, shared by every linear reading that input."""
    order: torch.Tensor  # [K] column order (act-order: descending diag H)
    hinv: torch.Tensor  # [K, K] upper Cholesky factor of the damped, permuted H⁻¹
    dead: torch.Tensor  # bool [K]: inputs never active in calibration
    damp: float
    retries: int


def factor_hessian(h: torch.Tensor, damp: float = 0.01, act_order: bool = True) -> HessianFactor:
    """Order and inverse Cholesky factor of the input Hessian h [K, K] (not modified)."""
    k = h.shape[0]
    dead = h.diagonal() == 0  # decoupled inputs: RTN rounds them
    diag = h.diagonal().masked_fill(dead, 1)
    order = torch.argsort(diag, descending=True, stable=True) if act_order else torch.arange(k, device=h.device)
    hp = h[order[:, None], order]  # permuted copy
    hp.diagonal()[dead[order]] = 1
    hinv, damp_used, retries = inverse_cholesky(hp, damp)
    return HessianFactor(order, hinv, dead, damp_used, retries)


def _column_rounder(grid: AnyWeight, columns: torch.Tensor):
    """round_column(column [1, N], i) -> (codes [1, N], dequantized fp32 [1, N]) of the block's i-th column
    (weight column columns[i]) on the grid: its round_onto, or for QoQ's progressive grid the same float
    operations with the column's s2 and z gathered once per block. The column loop runs a few dozen
    small ops per column, so each one saved counts (on a GPU, each is a kernel launch)."""
    if isinstance(grid, QuantizedWeight) and grid.group_size != -1:
        s1 = grid.s1.float()  # [N]
        groups = columns // grid.group_size  # [B]
        s2 = grid.s2[:, groups].float().t().unbind(0)  # B rows [N]
        z = grid.z[:, groups].float().t().unbind(0)

        def round_progressive(column: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            # weights._progressive_codes and round_onto_grid's dequantization, on a transposed column
            u = (column / s1).clamp(-PROTECTIVE_RANGE, PROTECTIVE_RANGE)
            q = torch.round((u + z[i]) / s2[i]).clamp(0, 15)
            return q, s1 * (q * s2[i] - z[i])

        return round_progressive

    def round_onto(column: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        q, w_hat = grid.round_onto(column.t(), columns[i : i + 1])  # [N, 1] each
        return q.t(), w_hat.t()

    return round_onto


def gptq_quantize(weight: torch.Tensor, h: torch.Tensor | HessianFactor, group_size: int,
                  clip_ratio: torch.Tensor | None = None, damp: float = 0.01, act_order: bool = True,
                  block_size: int = 128, grid: AnyWeight | None = None) -> tuple[AnyWeight, dict]:
    """GPTQ codes of weight [N, K] on its static grid, given the input Hessian h [K, K] (or its
    factor_hessian, which damp and act_order then do not change). `grid`: the fixed scales to round
    onto (any weight with round_onto / with_codes, its columns those of `weight`); default the QoQ
    grid of group_size and clip_ratio.
    Returns the quantized weight and a record (damping, retries, dead columns)."""
    n, k = weight.shape
    if isinstance(h, torch.Tensor):
        if h.shape != (k, k):
            raise ValueError(f"Hessian is {tuple(h.shape)}, the weight has K={k} input channels")
        h = factor_hessian(h, damp, act_order)
    elif h.order.shape[0] != k:
        raise ValueError(f"Hessian factor has K={h.order.shape[0]}, the weight has K={k} input channels")
    if grid is None:
        grid = quantize_weight(weight, group_size, clip_ratio)  # the fixed scales, and RTN's codes
    order, hinv = h.order, h.hinv
    # transposed, so a column of W is a contiguous row: wt[j] = W[:, order[j]]
    wt = weight.detach().float().t()[order].contiguous()  # [K, N]
    codes = torch.zeros(k, n, dtype=grid.q.dtype, device=wt.device)  # in act-order, transposed
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        block, hinv_block = wt[i1:i2], hinv[i1:i2, i1:i2]  # views [B, N], [B, B]
        err_block = torch.empty_like(block)
        round_column = _column_rounder(grid, order[i1:i2])
        # per-row views made once per block (one op each, not one per column): columns [1, N], their
        # codes and errors [1, N], H⁻¹ rows [B, 1] and diagonal entries
        columns, code_rows = block.unsqueeze(1).unbind(0), codes[i1:i2].unsqueeze(1).unbind(0)
        err_rows, hinv_rows = err_block.unsqueeze(1).unbind(0), hinv_block.unsqueeze(2).unbind(0)
        diagonal = hinv_block.diagonal().unbind(0)
        for i in range(i2 - i1):
            column = columns[i]  # [1, N]
            q, w_hat = round_column(column, i)  # [1, N] each
            code_rows[i].copy_(q)
            err = torch.div(column - w_hat, diagonal[i], out=err_rows[i])  # [1, N]
            block[i:].sub_(hinv_rows[i][i:] * err)  # rank-1 update of this block's later columns
        wt[i2:].sub_(hinv[i1:i2, i2:].t() @ err_block)  # lazy batch update of the later columns
    unpermuted = torch.empty_like(codes)
    unpermuted[order] = codes
    record = {"damp": h.damp, "retries": h.retries, "dead_columns": int(h.dead.sum())}
    return grid.with_codes(unpermuted.t().contiguous()), record


def _ordered_hessian(h: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    return h if order is None else h[order[:, None], order]


@dataclass(frozen=True)
class GPTQOptions:
    damp: float = 0.01  # relative to mean(diag H)
    act_order: bool = True  # quantize columns by descending diag(H)
    block_size: int = 128  # columns per lazy batch update
    max_tokens: int = 16384  # every token of a 32 x 512 calibration set (a seeded subsample beyond)


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
        o, fmt = self.options, ctx.recipe.format
        inputs = capture_linear_inputs(block, ctx, o.max_tokens)  # one [T, K] per shared input
        orders = {owner: ctx.input_orders.get(owner) for owner in inputs}  # GPTQ runs on ordered columns
        factors = {owner: factor_hessian(_ordered_hessian(hessian(x), orders[owner]), o.damp, o.act_order)
                   for owner, x in inputs.items()}
        errors = {owner: OutputError(x) for owner, x in inputs.items()}  # cheaper than through H when T < K
        del inputs
        record = {}
        for name in BLOCK_LINEARS:
            weight = block.get_submodule(name).weight.detach().float()  # [N, K]
            owner, clip = SHARED_INPUT[name], ctx.clip_ratios.get(name)
            order = orders[owner]
            grid = quantize_for_format(weight, fmt, clip, order)  # columns in `order`, as the Hessian's
            ordered = weight if order is None else weight[:, order]
            qw, record[name] = gptq_quantize(ordered, factors[owner], fmt.group_size, block_size=o.block_size,
                                             grid=grid)
            ctx.quantized[name] = qw
            error, signal = errors[owner], errors[owner](weight).sum().clamp_min(1e-30)  # ‖X·Wᵀ‖²
            rtn = fake_quantize_for_format(weight, fmt, clip, order)
            record[name]["rel_err"] = (error(weight - qw.dequantize()).sum() / signal).sqrt().item()
            record[name]["rel_err_rtn"] = (error(weight - rtn).sum() / signal).sqrt().item()
        return record
