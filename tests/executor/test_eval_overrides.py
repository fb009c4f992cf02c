"""`qoq eval --quantize` (qoq/executor/overrides.py) on tiny artifacts: the default path untouched, each
quantizer switched where the artifact allows it, one-line refusals where it does not."""

import json

import pytest
import torch
from checkpoints import make_tiny_checkpoint
from typer.testing import CliRunner

from qoq.cli import app
from qoq.eval.runner import evaluate_task
from qoq.executor.overrides import (
    DequantizedLinear,
    OverrideError,
    check_quantize,
    format_quantizers,
    parse_quantize,
)
from qoq.quant.activations import fake_quant_tokens
from qoq.quant.linear import IntegerLinear
from qoq.quant.weights import quantize_weight
from qoq.recipe_schema import Format

SEQ_LEN, WINDOWS = 64, 3


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, tiny_tokenizer, shared_data):
    from qoq.passes.pipeline import quantize_model
    from qoq.recipe import load_recipe

    root = tmp_path_factory.mktemp("overrides")
    ckpt = make_tiny_checkpoint(root / "ckpt", tiny_tokenizer)
    return {name: quantize_model(str(ckpt), load_recipe(name), root / name, data_dir=shared_data,
                                 show_progress=False).output
            for name in ("w4a8kv4g64-rtn", "fp16")}


def nll(art, shared_data, quantize=None, **kw):
    r = evaluate_task("wikitext2", str(art), windows=WINDOWS, seq_len=SEQ_LEN, data_dir=shared_data,
                      show_progress=False, quantize=quantize, **kw)
    return r["nll_per_window"]


def test_all_on_is_the_plain_eval_bit_for_bit(artifacts, shared_data):
    w4, fp16 = artifacts["w4a8kv4g64-rtn"], artifacts["fp16"]
    assert nll(w4, shared_data, "weights,activations,kv") == nll(w4, shared_data)
    assert nll(w4, shared_data, "kv,weights,activations") == nll(w4, shared_data)
    assert nll(fp16, shared_data, "none") == nll(fp16, shared_data)


def test_each_quantizer_switches(artifacts, shared_data):
    w4, fp16 = artifacts["w4a8kv4g64-rtn"], artifacts["fp16"]
    runs = {q: nll(w4, shared_data, q) for q in ("weights,activations,kv", "weights,activations", "weights,kv",
                                                 "weights")}
    floats = {q: nll(fp16, shared_data, q) for q in ("none", "activations", "kv", "activations,kv")}
    for results in (runs, floats):
        values = list(results.values())
        assert all(a != b for i, a in enumerate(values) for b in values[i + 1:]), results
    # on this near-uniform random model (NLL ~6) each quantizer moves a window's NLL a little, either way
    for a, b in ((runs["weights,activations,kv"], runs["weights,activations"]),
                 (runs["weights,activations"], runs["weights"]),
                 (floats["activations"], floats["none"]), (floats["kv"], floats["none"])):
        assert 0 < max(abs(x - y) for x, y in zip(a, b)) < 0.05


def test_dequantized_linear_is_the_integer_arithmetic_on_float_inputs():
    torch.manual_seed(0)
    w, x = torch.randn(64, 256), torch.randn(5, 256)
    for group in (64, -1):  # W8 = s2·q - z (group) and s1·q - szero (per channel)
        integer = IntegerLinear.from_quantized(quantize_weight(w, group), torch.randn(64).half())
        dequantized = DequantizedLinear(integer)
        assert (dequantized.weight - w).abs().max() < 0.5 * w.abs().max()
        x_hat = fake_quant_tokens(x)
        # the runtime's per-channel zero term reads the float input's sum (design §3.2), not x̂'s
        szero = 0 if integer.szero is None else integer.szero.float()
        zero_term = (x_hat.sum(-1, keepdim=True) - x.sum(-1, keepdim=True)) * szero
        torch.testing.assert_close(dequantized(x_hat) + zero_term, integer(x), rtol=1e-5, atol=1e-4)
        assert not torch.allclose(dequantized(x), integer(x), rtol=1e-3, atol=1e-3)


def test_parse_and_format_sets():
    assert parse_quantize(" kv , weights") == {"kv", "weights"}
    assert parse_quantize("none") == frozenset()
    assert format_quantizers(Format()) == {"weights", "activations", "kv"}
    assert format_quantizers(Format(weight_bits=16, act_bits=16, kv_bits=16, group_size=-1)) == frozenset()
    with pytest.raises(OverrideError, match="unknown quantizer 'acts'"):
        parse_quantize("weights,acts")
    with pytest.raises(OverrideError, match="empty"):
        parse_quantize(" , ")
    w4a16 = Format(act_bits=16, kv_bits=16, weight_scheme="asymmetric")
    check_quantize(w4a16, frozenset({"weights", "kv"}))  # KV4 switches on any format
    with pytest.raises(OverrideError, match="QoQ formats W4A8 and W16A16 only"):
        check_quantize(w4a16, frozenset({"weights", "activations"}))


def test_refusals(artifacts, shared_data, tmp_path):
    w4, fp16 = artifacts["w4a8kv4g64-rtn"], artifacts["fp16"]
    cases = [(fp16, "weights,activations", {}, "has 16-bit weights"),
             (w4, "activations,kv", {}, "cannot be switched off"),
             (w4, "weights", {"backend": "cuda", "engine_options": {"device": "cpu"}}, "--backend reference only"),
             (tmp_path, "kv", {}, "needs a qoq artifact")]
    for art, quantize, kw, message in cases:
        with pytest.raises(ValueError, match=message):
            nll(art, shared_data, quantize, **kw)


def test_cli_one_line_refusal_and_json(artifacts, shared_data):
    runner = CliRunner()
    bad = runner.invoke(app, ["eval", "wikitext2", str(artifacts["fp16"]), "--quantize", "weights",
                              "--data-dir", str(shared_data)])
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.exit_code == 1 and len(lines) == 1 and "has 16-bit weights" in lines[0], bad.output
    ok = runner.invoke(app, ["eval", "wikitext2", str(artifacts["w4a8kv4g64-rtn"]), "--windows", "1",
                             "--seq-len", str(SEQ_LEN), "--quantize", "weights", "--data-dir", str(shared_data),
                             "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["quantize"] == ["weights"]
