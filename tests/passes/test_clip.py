"""Clip-ratio search: clips rows whose outliers meet quiet inputs, leaves exact rows alone, and keeps
the progressive W8 invariants; the pass fills ctx.clip_ratios and records a summary."""

import pytest
import torch

from qoq.models.config import ModelConfig
from qoq.models.llama import Block
from qoq.passes import clip as _registers  # noqa: F401
from qoq.models.llama import BLOCK_LINEARS
from qoq.passes.base import BlockContext
from qoq.passes.capture import SHARED_INPUT, capture_linear_inputs
from qoq.passes.capture import OutputError
from qoq.passes.clip import Clip, ClipOptions, search_clip_ratios
from qoq.quant.weights import quantize_progressive, quantize_weight
from qoq.recipe import parse_recipe

N, K, T = 64, 256, 1024
OUTLIER_ROWS, EXACT_ROWS = range(0, 16), range(16, 24)
QUIET = torch.tensor([5, 77, 140])  # input channels with small activations, where the outliers sit


def exact_rows(group: int, g: torch.Generator) -> torch.Tensor:
    """Rows [8, K] that quantize with zero error at r = 1 (every value on the grid)."""
    codes = torch.randint(0, 16, (len(EXACT_ROWS), K), generator=g).float()
    span = K if group == -1 else group
    codes[:, ::span], codes[:, 1::span] = 0, 15  # each group (or row) spans the full code range
    if group == -1:
        return codes * 0.125 - 0.5  # s = 0.125, szero = 0.5: fp16-exact
    return (8 * codes - 120) / 128  # U = 8q - 120 in [-120, 0]: s1 = 2^-7, s2 = 8, z = 120


def clip_problem(group: int):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g) * 0.02  # [N, K]
    sign = torch.sign(torch.randn(len(OUTLIER_ROWS), len(QUIET), generator=g))
    w[:16, QUIET] = 0.02 * (10 + 5 * torch.rand(len(OUTLIER_ROWS), len(QUIET), generator=g)) * sign
    w[16:24] = exact_rows(group, g)
    x = torch.randn(T, K, generator=g) @ (torch.eye(K) + 0.3 * torch.randn(K, K, generator=g) / K**0.5)
    x[:, QUIET] *= 0.05  # [T, K]
    return w, x


@pytest.mark.parametrize("group", [-1, 64, 128])
def test_outlier_rows_clip_and_exact_rows_do_not(group):
    w, x = clip_problem(group)
    ratio, err_one, err_best = search_clip_ratios(w, group, OutputError(x), torch.linspace(1.0, 0.5, 20))
    outliers, exact = list(OUTLIER_ROWS), list(EXACT_ROWS)
    assert (ratio[outliers] <= 0.75).all()
    assert (err_best[outliers] < 0.7 * err_one[outliers]).all()
    assert (err_one[exact] == 0).all() and (ratio[exact] == 1.0).all()
    assert (err_best <= err_one).all() and ((ratio >= 0.5) & (ratio <= 1)).all()
    # the reported errors are the true calibration output errors of the chosen ratios
    w_hat = quantize_weight(w, group, clip_ratio=ratio).dequantize()
    direct = (x @ (w - w_hat).T).pow(2).sum(0)  # [N]
    assert torch.allclose(direct, err_best, rtol=1e-3, atol=1e-9)


def test_gram_and_direct_output_errors_agree():
    g = torch.Generator().manual_seed(1)
    delta = torch.randn(16, 64, generator=g)
    many_tokens, few_tokens = torch.randn(200, 64, generator=g), torch.randn(40, 64, generator=g)
    assert OutputError(many_tokens).gram is not None and OutputError(few_tokens).gram is None
    for x in (many_tokens, few_tokens):
        assert torch.allclose(OutputError(x)(delta), (x @ delta.T).pow(2).sum(0), rtol=1e-4)


@pytest.mark.parametrize("group", [64, 128])
def test_clipped_progressive_keeps_int8_invariants(group):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g) * 0.02
    w[::3, ::17] *= 40  # outliers that a small ratio clamps hard
    ratio = torch.linspace(0.3, 1.0, 64)
    qw = quantize_progressive(w, group, clip_ratio=ratio)
    w8 = qw.w8().long()
    assert int(w8.min()) >= -128 and int(w8.max()) <= 127
    assert int((qw.q.long() * qw.s2.repeat_interleave(group, 1).long()).max()) <= 255
    assert int(qw.s2.max()) <= 16
    expected_s1 = (ratio * w.abs().amax(1) / 120).half()
    assert torch.equal(qw.s1, expected_s1)
    clamped = w.abs() > ratio[:, None] * w.abs().amax(1, keepdim=True) * 1.001
    assert clamped.any()  # the clipped values reconstruct at most ~127 s1 in magnitude
    assert (qw.dequantize().abs() <= 127 * qw.s1.float()[:, None] + 1e-12).all()
    with pytest.raises(ValueError, match="positive and finite"):
        quantize_progressive(w, group, clip_ratio=torch.zeros(64))


CFG = ModelConfig.from_hf({
    "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 64})


def test_pass_fills_clip_ratios_and_records_summary():
    torch.manual_seed(0)
    block = Block(CFG)
    recipe = parse_recipe({"passes": ["clip", "rtn"], "format": {"group_size": -1},
                           "pass_options": {"clip": {"grid": 11, "max_tokens": 256}}}, "t", "test")
    ctx = BlockContext(0, CFG, recipe, torch.randn(4, 32, 64), torch.arange(32))
    record = Clip(recipe.pass_options["clip"]).apply(block, ctx)
    assert set(ctx.clip_ratios) == set(BLOCK_LINEARS) == set(record)
    inputs = capture_linear_inputs(block, ctx, 256)
    assert inputs["mlp.down_proj"].shape == (128, 128)  # all 4*32 tokens fit under max_tokens
    for name, r in ctx.clip_ratios.items():
        weight = block.get_submodule(name).weight.detach()
        assert r.shape == (weight.shape[0],) and r.dtype == torch.float32 and ((r >= 0.5) & (r <= 1)).all()
        x = inputs[SHARED_INPUT[name]]  # [T, K]

        def rel(ratio):
            w_hat = quantize_weight(weight, -1, clip_ratio=ratio).dequantize()
            return ((x @ (weight - w_hat).T).norm() / (x @ weight.T).norm()).item()

        assert record[name]["rel_err_before"] == pytest.approx(rel(None), rel=1e-3)
        assert record[name]["rel_err_after"] == pytest.approx(rel(r), rel=1e-3)
        assert record[name]["rel_err_after"] < record[name]["rel_err_before"]  # Gaussian rows gain too
        assert record[name]["ratio_min"] == pytest.approx(r.min().item(), abs=1e-6)
    with pytest.raises(ValueError, match="min_ratio"):
        Clip(ClipOptions(min_ratio=0.0))
