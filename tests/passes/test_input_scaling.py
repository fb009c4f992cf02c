"""SmoothQuant: its input scaling keeps every block's float function; the search records what it chose."""

import pytest
import torch

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
    ctx, h = _context(lm, Format())
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
