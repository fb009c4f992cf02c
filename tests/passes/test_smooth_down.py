import copy

import pytest
import torch

from qoq.models.config import ModelConfig
from qoq.models.llama import Block
from qoq.passes.base import BlockContext
from qoq.passes.capture import capture_inputs, input_abs_max
from qoq.passes.smooth_down import SmoothDown, SmoothDownOptions, quantized_mse, search_scales, smoothing_scales
from qoq.quant.activations import fake_quant_tokens
from qoq.quant.weights import quantize_weight
from qoq.recipe import parse_recipe
from tiny_models import TINY, random_lm

BLOCK_CFG = ModelConfig.from_hf({"model_type": "llama", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
                                 "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "rms_norm_eps": 1e-5, "max_position_embeddings": 64})
OUTLIERS = [5, 77, 150, 201]  # down_proj input channels, spread over the g64 groups


def recipe(group_size: int = 128, **options):
    raw = {"passes": ["smooth_down", "rtn"], "format": {"group_size": group_size}}
    return parse_recipe({**raw, "pass_options": {"smooth_down": options}}, "test", "test")


@pytest.mark.parametrize("arch", sorted(TINY))
def test_smooth_down_keeps_logits(arch):
    lm = random_lm(TINY[arch])
    calib, probe = torch.randint(0, 256, (4, 32)), torch.randint(0, 256, (2, 24))
    r = recipe(search=False)  # fixed α = β = 0.5: a real rescale whatever the search would pick
    smooth = SmoothDown(r.pass_options["smooth_down"])
    with torch.no_grad():
        reference = lm(probe)
        h, pos = lm.embed(calib), lm.position_ids(32)
        for i, block in enumerate(lm.layers):
            record = smooth.apply(block, BlockContext(i, lm.config, r, h, pos))
            assert record["lambda_max"] / record["lambda_min"] > 1.5
            h = block(h, pos)
        rel = ((lm(probe) - reference).norm() / reference.norm()).item()
    assert rel < 1e-4, rel


def outlier_block() -> Block:
    """Activation outlier channels in down_proj's input: X_j = SiLU(gate_j)·up_j, some ~100x the rest."""
    torch.manual_seed(0)
    block = Block(BLOCK_CFG)
    with torch.no_grad():
        block.mlp.up_proj.weight[OUTLIERS] *= 30
        block.mlp.gate_proj.weight[OUTLIERS] *= 3
    return block


def w4a8_output(x: torch.Tensor, w: torch.Tensor, group_size: int) -> torch.Tensor:
    """Reference W4A8 linear from the quantizers: x [M, K], w [N, K] -> [M, N] (docs/design.md §3.1 / §3.2 GEMM)."""
    qw, x_hat = quantize_weight(w, group_size), fake_quant_tokens(x)
    if group_size == -1:  # the zero term uses the activation sum before quantization
        return x_hat @ (qw.q.float() * qw.s1.float()[:, None]).t() - x.sum(-1, keepdim=True) * qw.szero.float()
    return x_hat @ qw.dequantize().t()


def down_proj_error(block: Block, h, pos, group_size: int) -> float:
    x = capture_inputs(block, h, pos, ["mlp.down_proj"])["mlp.down_proj"]  # [tokens, I]
    w = block.mlp.down_proj.weight.detach()
    reference = x @ w.t()
    return ((w4a8_output(x, w, group_size) - reference).norm() / reference.norm()).item()


@pytest.mark.parametrize("group_size", [128, 64, -1])
def test_smooth_down_lowers_w4a8_error_with_activation_outliers(group_size):
    block, h, pos = outlier_block(), torch.randn(4, 32, 128), torch.arange(32)
    before = down_proj_error(block, h, pos, group_size)
    record = SmoothDown().apply(block, BlockContext(0, BLOCK_CFG, recipe(group_size), h, pos))
    after = down_proj_error(block, h, pos, group_size)
    # measured rel err 0.069 -> 0.036 (g128), 0.069 -> 0.030 (g64), 0.078 -> 0.055 (per channel)
    assert after < 0.8 * before, (before, after)
    assert record["searched"] and record["mse_after"] < 0.6 * record["mse_before"]


def test_quantized_mse_matches_the_quantizer_reference():
    torch.manual_seed(2)
    x, w, lam = torch.randn(64, 256), torch.randn(32, 256) * 0.05, torch.rand(256) + 0.5
    for g in (128, -1):
        expected = (w4a8_output(x / lam, w * lam, g) - x @ w.t()).pow(2).mean().item()
        assert quantized_mse(x, w, lam, g) == pytest.approx(expected, rel=1e-4)


def test_search_picks_the_least_mse_grid_point_and_is_deterministic():
    block, h, pos = outlier_block(), torch.randn(4, 32, 128), torch.arange(32)
    r = recipe(64)
    x = capture_inputs(block, h, pos, ["mlp.down_proj"])["mlp.down_proj"]  # all 128 tokens (< max_tokens)
    x_max = input_abs_max(block, h, pos, ["mlp.down_proj"])["mlp.down_proj"]
    weight = block.mlp.down_proj.weight.detach().clone()
    alpha, beta, table = search_scales(x, x_max, weight, r.pass_options["smooth_down"].grid(), 64)
    assert len(table) == 25 and table[(alpha, beta)] == min(table.values())
    assert alpha > 0  # activation outliers: migrating them into the weights must pay off

    twin = copy.deepcopy(block)
    record = SmoothDown(r.pass_options["smooth_down"]).apply(block, BlockContext(0, BLOCK_CFG, r, h, pos))
    assert (record["alpha"], record["beta"]) == (alpha, beta)
    assert record["mse_after"] == pytest.approx(table[(alpha, beta)], rel=1e-6)
    assert record["mse_before"] == pytest.approx(table[(0.0, 0.0)], rel=1e-6)  # λ = 1 is the grid's first point
    assert SmoothDown(r.pass_options["smooth_down"]).apply(twin, BlockContext(0, BLOCK_CFG, r, h, pos)) == record
    for name in ("up_proj", "down_proj", "gate_proj"):
        assert torch.equal(getattr(twin.mlp, name).weight, getattr(block.mlp, name).weight)


def test_fixed_alpha_beta_fold_exactly_those_scales():
    block, h, pos = outlier_block(), torch.randn(4, 32, 128), torch.arange(32)
    r = recipe(128, search=False, alpha=0.3, beta=0.1)
    x_max = input_abs_max(block, h, pos, ["mlp.down_proj"])["mlp.down_proj"]
    down = block.mlp.down_proj.weight.detach().clone()
    lam = smoothing_scales(x_max, down.abs().amax(0), 0.3, 0.1)
    record = SmoothDown(r.pass_options["smooth_down"]).apply(block, BlockContext(0, BLOCK_CFG, r, h, pos))
    assert (record["alpha"], record["beta"], record["searched"]) == (0.3, 0.1, False)
    torch.testing.assert_close(block.mlp.down_proj.weight, down * lam[None, :])
    assert lam.max() * lam.min() == pytest.approx(1.0, rel=1e-5)  # centred: both weights stay in fp16 range


def test_options_are_checked_and_w16_skips_the_search():
    assert SmoothDownOptions(grid_step=0.25).grid()[:2] == [(0.0, 0.0), (0.0, 0.25)]
    with pytest.raises(ValueError, match="grid_step"):
        SmoothDownOptions(grid_step=0.0)
    with pytest.raises(ValueError, match="beta must lie in"):
        SmoothDownOptions(beta=-0.1)
    r = parse_recipe({"passes": ["smooth_down"], "format": {"weight_bits": 16, "act_bits": 16, "kv_bits": 16}},
                     "w16", "test")
    block, h, pos = outlier_block(), torch.randn(2, 16, 128), torch.arange(16)
    record = SmoothDown().apply(block, BlockContext(0, BLOCK_CFG, r, h, pos))
    assert record["searched"] is False and "mse_after" not in record and record["alpha"] == 0.5
