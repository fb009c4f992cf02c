"""SmoothQuant and AWQ (input_scaling.py): their input scaling keeps every block's float function; the searches record
what they chose, and AWQ's scaling never does worse than no scaling (α = 0 is on its grid)."""

import dataclasses

import pytest
import torch

from qoq.passes.awq import AWQ, AWQOptions, search_group_clip
from qoq.passes.base import BlockContext
from qoq.passes.input_scaling import SCALABLE_INPUTS, fold_input_scales
from qoq.passes.smoothquant import SmoothQuant, SmoothQuantOptions
from qoq.recipe import Calibration, Format, Recipe
from tests.passes.tiny_models import TINY, random_lm


def _context(lm, fmt, block_index=0):
    torch.manual_seed(1)
    h = torch.randn(4, 32, lm.config.hidden_size)
    h[..., :3] *= 20  # outlier channels in the residual
    recipe = Recipe("t", "", (), fmt, Calibration(samples=4, seq_len=32))
    return BlockContext(block_index, lm.config, recipe, h, torch.arange(32)), h


def _out(block, h):
    with torch.inference_mode():
        return block(h, torch.arange(h.shape[1]))


@pytest.mark.parametrize("model", list(TINY))
def test_fold_input_scales_is_exact(model):
    lm = random_lm(TINY[model])
    block = lm.model.layers[0]
    _, h = _context(lm, Format())
    before = _out(block, h)
    for owner in SCALABLE_INPUTS:
        k = block.get_submodule(owner).in_features
        fold_input_scales(block, owner, torch.rand(k) + 0.5)
    torch.testing.assert_close(_out(block, h), before, rtol=1e-4, atol=1e-4)


def test_smoothquant_searches_alpha_and_keeps_the_function():
    lm = random_lm(TINY["qwen2-bias"])
    block = lm.model.layers[0]
    fmt = Format(weight_bits=8, group_size=-1, act_bits=8, kv_bits=16, weight_scheme="symmetric")
    ctx, h = _context(lm, fmt)
    before = _out(block, h)
    record = SmoothQuant(SmoothQuantOptions(grid_step=0.25)).apply(block, ctx)
    torch.testing.assert_close(_out(block, h), before, rtol=1e-4, atol=1e-4)
    assert set(record) == set(SCALABLE_INPUTS)
    for r in record.values():
        assert r["alpha"] in (0.0, 0.25, 0.5, 0.75, 1.0) and r["mse_after"] > 0
    # the residual's outlier channels reach q/k/v: smoothing them lowers the W8A8 error there
    assert record["self_attn.q_proj"]["mse_after"] < record["self_attn.q_proj"]["mse_before"]


def test_awq_scaling_never_hurts_and_clips_all_but_q_k():
    lm = random_lm(TINY["qwen2-bias"])
    block = lm.model.layers[0]
    fmt = Format(weight_bits=4, group_size=64, act_bits=16, kv_bits=16, weight_scheme="asymmetric")
    ctx, h = _context(lm, fmt)
    before = _out(block, h)
    record = AWQ(AWQOptions(grid=5, clip_grid=4)).apply(block, ctx)
    torch.testing.assert_close(_out(block, h), before, rtol=1e-4, atol=1e-4)  # scaling only; clips are ratios
    for r in record["scales"].values():
        assert r["rel_err_after"] <= r["rel_err_before"]
    assert set(ctx.clip_ratios) == {"self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                    "mlp.down_proj"}
    assert ctx.clip_ratios["mlp.down_proj"].shape == (128, 256 // 64)


def test_group_clip_search_picks_per_group_and_lowers_the_error():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(16, 128, generator=g), torch.randn(200, 128, generator=g)
    w[0, 5] = 12.0  # one large weight: clipping its group pays
    ratio, before, after = search_group_clip(w, x, 64, torch.linspace(1.0, 0.5, 6))
    assert ratio.shape == (16, 2) and after <= before and ratio[0, 0] < 1.0
    assert dataclasses.is_dataclass(AWQOptions())
