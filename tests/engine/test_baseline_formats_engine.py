"""The engine on the baseline formats, on the CPU: the reference runner serves W4A4 (Atom/QuaRot) as the
executor computes it; the CUDA runner's data flow (torch references, fp32) runs W8A8 through the executor's
integer modules and W4A16 through dequantized weights and gives the reference runner's tokens; the CUDA
runner refuses W4A4 in one line (no INT4 tensor-core MMA on Hopper)."""

import dataclasses

import pytest

from qoq.engine import SamplingParams
from qoq.recipe import Calibration, load_recipe
from tests.engine.engine_support import PROMPTS

FP32_FLOW = {"backend": "cuda", "device": "cpu", "ops": "reference", "record_logits": True}
FORMATS = {  # name -> recipe body (round to nearest: the formats, not the algorithms, are under test)
    "w8a8": 'passes = ["rtn"]\n[format]\nweight_bits = 8\ngroup_size = -1\nact_bits = 8\nkv_bits = 16\n'
            'weight_scheme = "symmetric"\n',
    "w4a16": 'passes = ["rtn"]\n[format]\nweight_bits = 4\ngroup_size = 64\nact_bits = 16\nkv_bits = 16\n'
             'weight_scheme = "asymmetric"\n',
    "w4a4": 'passes = ["rtn"]\n[format]\nweight_bits = 4\ngroup_size = -1\nact_bits = 4\nkv_bits = 4\n'
            'weight_scheme = "symmetric"\nact_clip = 0.9\n',
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, tiny_ckpt, shared_data):
    from qoq.passes.pipeline import quantize_model

    root = tmp_path_factory.mktemp("baseline_formats")
    out = {}
    for name, body in FORMATS.items():
        (root / f"{name}.toml").write_text(body)
        recipe = dataclasses.replace(load_recipe(str(root / f"{name}.toml")),
                                     calibration=Calibration(samples=2, seq_len=64, seed=42))
        out[name] = quantize_model(str(tiny_ckpt), recipe, root / name, data_dir=shared_data, show_progress=False).output
    return out


@pytest.mark.parametrize("kind", ["w8a8", "w4a16"])
def test_cuda_data_flow_is_the_reference_runner(make_engine, artifacts, kind):
    import torch

    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = make_engine(artifacts[kind], record_logits=True, max_num_batched_tokens=24).generate(PROMPTS, params)
    got = make_engine(artifacts[kind], kv_budget=1 << 20, max_num_batched_tokens=24, dtype=torch.float32,
                      **FP32_FLOW).generate(PROMPTS, params)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logits, w.logits):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_reference_engine_serves_w4a4_and_the_cuda_runner_refuses_it(make_engine, artifacts):
    from qoq.engine.runner_cuda import CudaRunner

    outs = make_engine(artifacts["w4a4"]).generate(PROMPTS[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs)
    with pytest.raises(ValueError, match="W4A4 artifacts have no GPU path: Hopper has no INT4 tensor-core MMA"):
        CudaRunner(artifacts["w4a4"], kv_budget=1 << 20, device="cpu", ops="reference")


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["w8a8", "w4a16"])
def test_cuda_engine_runs_w8a8_and_w4a16_near_the_reference(make_engine, artifacts, kind):
    """On the GPU in fp16 (W8A8: the executor's _int_mm modules, no CUDA graphs; W4A16: dequantized fp16
    weights through cuBLAS): the first generated token's logits near the reference runner's."""
    import torch

    params = SamplingParams(max_tokens=2, ignore_eos=True)
    want = make_engine(artifacts[kind], record_logits=True).generate(PROMPTS, params)
    got = make_engine(artifacts[kind], backend="cuda", kv_budget=64 << 20, record_logits=True).generate(PROMPTS, params)
    for g, w in zip(got, want):
        a, b = g.logits[0].float().cpu(), w.logits[0].float().cpu()
        assert ((a - b).norm() / b.norm()).item() < 0.05
        assert torch.isfinite(a).all()
