"""GPTQ on the static W4 grids: beats RTN on correlated inputs, act-order helps, rank-deficient
Hessians are damped until they factor, codes export and run like RTN's; clip + gptq beats rtn end to end."""

import pytest
import torch

from checkpoints import make_tiny_checkpoint
from qoq.passes import clip as _clip_registers  # noqa: F401
from qoq.passes import gptq as _gptq_registers  # noqa: F401
from qoq.passes.capture import OutputError
from qoq.passes.gptq import GPTQ, GPTQOptions, gptq_quantize, hessian
from qoq.passes.pipeline import quantize_model
from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.weights import quantize_weight, round_onto_grid
from qoq.recipe import parse_recipe

N, K, T = 64, 256, 1024
GROUPS = [-1, 64, 128]


def linear_problem(seed: int, loud_channels: int = 0):
    """A weight [N, K] and calibration inputs [T, K]: mixed (correlated) Gaussians, optionally with a
    few input channels of 10x the variance."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.02
    z = torch.randn(T, K, generator=g)
    if loud_channels:
        z[:, torch.randperm(K, generator=g)[:loud_channels]] *= 10
        return w, z @ (torch.eye(K) + 0.2 * torch.randn(K, K, generator=g) / K**0.5)
    return w, z @ torch.randn(K, K, generator=g) / K**0.5


def output_error(w, qw, x) -> float:
    return ((x @ (w - qw.dequantize()).T).norm() / (x @ w.T).norm()).item()


@pytest.mark.parametrize("group", GROUPS)
def test_gptq_beats_rtn_on_correlated_inputs(group):
    w, x = linear_problem(0)
    qw, record = gptq_quantize(w, hessian(x), group)
    rtn = quantize_weight(w, group)
    assert output_error(w, qw, x) < 0.8 * output_error(w, rtn, x)
    delta = w - qw.dequantize()  # the error the pass records, per channel: ‖X·ΔWᵀ‖² either way
    assert (OutputError(x)(delta).sum().sqrt() / (x @ w.T).norm()).item() == pytest.approx(output_error(w, qw, x), rel=1e-3)
    assert OutputError(x[:200])(delta).sum().sqrt().item() == pytest.approx((x[:200] @ delta.T).norm().item(), rel=1e-3)
    assert record == {"damp": 0.01, "retries": 0, "dead_columns": 0}
    # the grid is RTN's: same scales, only codes differ
    assert torch.equal(qw.s1, rtn.s1) and (group == -1 or torch.equal(qw.s2, rtn.s2) and torch.equal(qw.z, rtn.z))
    assert (qw.q != rtn.q).float().mean() > 0.05


@pytest.mark.parametrize("group", GROUPS)
def test_act_order_helps_with_loud_input_channels(group):
    w, x = linear_problem(1, loud_channels=8)
    h = hessian(x)
    ordered, _ = gptq_quantize(w, h, group, act_order=True)
    plain, _ = gptq_quantize(w, h, group, act_order=False)
    assert output_error(w, ordered, x) < 0.97 * output_error(w, plain, x)


@pytest.mark.parametrize("group", [-1, 64])
def test_rank_deficient_hessian_retries_damping(group):
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(32, 128, generator=g) * 0.02, torch.randn(512, 128, generator=g)
    x[:, 10:20] = 0  # dead input channels
    x[:, 40:60] = x[:, 20:40]  # duplicated input channels
    h = hessian(x)
    assert torch.linalg.cholesky_ex(h).info > 0  # singular as built
    qw, record = gptq_quantize(w, h, group, damp=0.0)
    assert record == {"damp": 1e-3, "retries": 1, "dead_columns": 10}
    assert torch.isfinite(qw.dequantize()).all()
    assert output_error(w, qw, x) < output_error(w, quantize_weight(w, group), x)
    # dead columns are decoupled: rounded to nearest on the grid, as RTN does
    assert torch.equal(qw.q[:, 10:20], quantize_weight(w, group).q[:, 10:20])


@pytest.mark.parametrize("group", GROUPS)
def test_gptq_weight_keeps_invariants_and_round_trips_export(group):
    w, x = linear_problem(3)
    w[::5, ::9] *= 20  # outliers push GPTQ's updated columns off the grid's range
    clip = torch.linspace(0.6, 1.0, N)
    qw, _ = gptq_quantize(w, hessian(x), group, clip_ratio=clip)
    assert qw.q.dtype == torch.uint8 and int(qw.q.max()) <= 15
    if group != -1:
        w8 = qw.w8().long()
        assert int(w8.min()) >= -128 and int(w8.max()) <= 127
        assert int((qw.q.long() * qw.s2.repeat_interleave(group, 1).long()).max()) <= 255
    assert torch.equal(qw.s1, quantize_weight(w, group, clip_ratio=clip).s1)
    bias = torch.randn(N).half()
    exported = IntegerLinear.from_tensors(export_linear("lin", qw, bias), "lin")
    direct = IntegerLinear.from_quantized(qw, bias)
    assert torch.equal(exported.weight, direct.weight) and torch.equal(exported.s1, direct.s1)
    xs = x[:16].half()
    assert torch.equal(exported(xs), direct(xs))


@pytest.mark.parametrize("group", GROUPS)
def test_round_onto_grid_reproduces_rtn_codes(group):
    w, _ = linear_problem(4)
    rtn = quantize_weight(w, group, clip_ratio=torch.linspace(0.7, 1.0, N))
    q, w_hat = round_onto_grid(w, rtn)
    assert torch.equal(q, rtn.q) and torch.equal(w_hat, rtn.dequantize())
    cols = torch.tensor([200, 3, 130])
    q_cols, _ = round_onto_grid(w[:, cols], rtn, cols)
    assert torch.equal(q_cols, rtn.q[:, cols])
    with pytest.raises(ValueError, match="expected"):
        round_onto_grid(w[:, :3], rtn)
    with pytest.raises(ValueError, match="damp"):
        GPTQ(GPTQOptions(damp=-1.0))


def test_clip_then_gptq_beats_rtn_in_the_pipeline(tmp_path, tiny_tokenizer, shared_data):
    model = make_tiny_checkpoint(tmp_path / "tiny", tiny_tokenizer)
    errors = {}
    for passes in (["rtn"], ["clip", "gptq"]):
        raw = {"passes": passes, "format": {"group_size": 128},
               "calibration": {"data": "pile-val", "samples": 4, "seq_len": 128},
               "pass_options": {"clip": {"grid": 8}} if "clip" in passes else {}}
        recipe = parse_recipe(raw, "+".join(passes), "test")
        result = quantize_model(str(model), recipe, tmp_path / "+".join(passes), data_dir=shared_data,
                                show_progress=False)
        errors["+".join(passes)] = result.summary["block_rel_err_mean"]
    assert errors["clip+gptq"] < 0.8 * errors["rtn"]
