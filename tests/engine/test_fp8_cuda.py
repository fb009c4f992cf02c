"""The fp8 path on the GPU (skipped without one): Fp8Linear through torch._scaled_mm against its torch
reference (eager and inside a CUDA graph), and the engine with `quantization="fp8"` against the same path
on the CPU (the reference numbers), against the fp16 engine, and graphs against eager. Run on the H200:
    PYTHONPATH=$PWD QOQ_DATA_DIR=... python -m pytest -q -p no:cacheprovider -m cuda tests/engine/test_fp8_cuda.py
"""

import pytest
import torch

from qoq.engine import SamplingParams
from qoq.engine.fp8_linear import Fp8Linear, quantize_rows, reference_scaled_mm
from tests.engine.engine_support import PROMPTS, assert_same_until_near_tie
from tests.engine.engine_support import rel as _rel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9), reason="FP8 needs sm_89+")]

GPU = dict(backend="cuda", kv_budget=64 << 20, record_logits=True)


@pytest.fixture(scope="module")
def cuda_fp16(tmp_path_factory, tiny_tokenizer, shared_data):
    """A tiny fp16 artifact whose dims _scaled_mm takes (multiples of 16; head_dim 64)."""
    from checkpoints import make_tiny_checkpoint
    from tests.engine.engine_support import small
    from qoq.passes.pipeline import quantize_model

    ckpt = make_tiny_checkpoint(tmp_path_factory.mktemp("fp8_ck"), tiny_tokenizer, hidden=256, heads=4, kv_heads=2,
                                layers=2, intermediate=512)
    art = tmp_path_factory.mktemp("fp8_art") / "fp16"
    quantize_model(str(ckpt), small("fp16"), art, data_dir=shared_data, show_progress=False)
    return art


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16, 17, 100, 256])
def test_scaled_mm_matches_reference(m, bias):
    torch.manual_seed(m)
    n, k = 1536, 4096
    w = (torch.randn(n, k, device="cuda") * 0.02).half()
    b = torch.randn(n, device="cuda").half() if bias else None
    x = torch.randn(m, k, device="cuda").half()
    lin = Fp8Linear.from_fp16(w, b)
    assert lin.kernel and lin.wq.dtype == torch.float8_e4m3fn
    got = lin(x)
    xq, sx = quantize_rows(x)
    want = reference_scaled_mm(xq, sx, lin.wq, lin.w_scale, lin.bias)
    assert got.dtype == torch.float16 and got.shape == (m, n)
    # the same codes and scales: only the fp32 summation order and the fp16 rounding may differ
    assert (got.float() - want.float()).abs().max().item() <= 2e-3 * want.float().abs().max().item()
    assert _rel(got.float(), torch.nn.functional.linear(x, w, b).float()) < 0.05  # fp8 vs fp16


def test_fp8_linear_in_a_cuda_graph():
    torch.manual_seed(0)
    lin = Fp8Linear.from_fp16((torch.randn(512, 256, device="cuda") * 0.05).half())
    x = torch.randn(8, 256, device="cuda").half()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        lin(x)  # warm-up outside the capture (cuBLAS handle and workspace)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = lin(x)
    for seed in (1, 2):
        torch.manual_seed(seed)
        x.copy_(torch.randn(8, 256, device="cuda").half())
        graph.replay()
        assert torch.equal(y, lin(x))


def test_fp8_engine_gpu_matches_cpu_reference(make_engine, cuda_fp16):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    cpu = make_engine(cuda_fp16, backend="cuda", device="cpu", ops="reference", kv_budget=64 << 20,
                      quantization="fp8", record_logits=True).generate(PROMPTS, params)
    engine = make_engine(cuda_fp16, quantization="fp8", **GPU)
    gpu = engine.generate(PROMPTS, params)
    assert all(L.qkv.kernel and L.down.wq.is_cuda for L in engine.runner.layers)
    for c, g in zip(cpu, gpu):
        # same e4m3 codes but for fp16 activations that round differently on the two devices
        assert_same_until_near_tie(c, g, margin=2e-2)
        assert _rel(g.logits[0], c.logits[0]) < 3e-2


def test_fp8_engine_close_to_fp16_engine_on_gpu(make_engine, cuda_fp16):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    fp16 = make_engine(cuda_fp16, **GPU).generate(PROMPTS, params)
    fp8 = make_engine(cuda_fp16, quantization="fp8", **GPU).generate(PROMPTS, params)
    for w, g in zip(fp16, fp8):
        # this model's logits (std ~0.3) move by ~8% relative under fp8, up to ~0.1 absolute (the same
        # comparison through the CPU reference): tokens agree until a top-2 gap under 0.2
        n = assert_same_until_near_tie(w, g, margin=0.2)
        assert max(_rel(a, b) for a, b in list(zip(g.logits, w.logits))[: n + 1]) < 0.15


def test_fp8_graph_decode_equals_eager_decode(make_engine, cuda_fp16):
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    eager = make_engine(cuda_fp16, quantization="fp8", cuda_graphs=False, **GPU).generate(PROMPTS, params)
    engine = make_engine(cuda_fp16, quantization="fp8", **GPU)
    graphed = engine.generate(PROMPTS, params)
    assert engine.runner.graphs.graphs, "no decode step went through a graph"
    for e, g in zip(eager, graphed):
        # a graph runs the batch padded to its bucket: cuBLAS may pick another kernel for that M
        n = assert_same_until_near_tie(e, g, margin=1e-3)
        assert max(_rel(a, b) for a, b in list(zip(g.logits, e.logits))[: n + 1]) < 1e-2


def test_generate_cli_fp8(cuda_fp16):
    import json

    from typer.testing import CliRunner

    from qoq.cli import app
    from qoq.engine import LLMEngine

    expected = LLMEngine(cuda_fp16, backend="cuda", kv_budget=64 << 20, quantization="fp8").generate(
        ["The game"], SamplingParams(max_tokens=6))[0]
    res = CliRunner().invoke(app, ["generate", str(cuda_fp16), "--prompt", "The game", "--max-tokens", "6", "--backend",
                                   "cuda", "--kv-budget", str(64 << 20), "--quantization", "fp8", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["token_ids"] == expected.token_ids
