"""Two GPUs in one process: each kernel runs on its operands' GPU whichever device is current, with its
per-GPU setup (the shared-memory opt-in, occupancy queries) made on that GPU as well, after the first GPU
has made its own; operands spread over two GPUs are refused by name."""

import pytest
import torch

from qoq.quant.linear import export_linear
from qoq.quant.weights import quantize_weight
from qoq.runtime_cuda import attention, quant_kernels
from qoq.runtime_cuda import attention_reference as ref
from qoq.runtime_cuda.gemm import VARIANTS, is_hopper, w4a8_accumulators, w4a8_gemm
from tests.runtime_cuda.kv_inputs import decode_inputs

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs")]
HOPPER = TWO_GPUS and all(is_hopper(torch.device(f"cuda:{i}")) for i in (0, 1))


def _linear(n: int, k: int, group_size: int) -> dict:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
    return export_linear("w", quantize_weight(w, group_size), None)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if HOPPER or not v.startswith("wg")])
@pytest.mark.parametrize("group_size", [128, -1])
def test_gemm_runs_on_the_gpu_of_its_operands(variant, group_size):
    # K = 4096 at M = 16 stages 64 KB of activation rows in the GEMVs' shared memory: past the 48 KB a
    # kernel gets without the opt-in, which each GPU needs for itself
    m = 16 if variant.startswith("gemv") else 64
    t, gen = _linear(256, 4096, group_size), torch.Generator().manual_seed(m)
    qx = torch.randint(-119, 120, (m, 4096), dtype=torch.int8, generator=gen)
    s_x = torch.rand(m, generator=gen).half() + 0.5
    terms = {name: t[f"w.{name}"] for name in ("s2_scales", "s2_zeros") if f"w.{name}" in t}
    if group_size == -1:
        terms["s1_szeros"] = t["w.s1_szeros"]
        terms["xsum"] = torch.randn(m, generator=gen) * 100
    results = []
    with torch.cuda.device(0):  # cuda:0 stays current throughout; cuda:0 runs first
        for device in ("cuda:0", "cuda:1"):
            on = {name: v.to(device) for name, v in terms.items()}
            group_terms = {name: v for name, v in on.items() if name.startswith("s2")}
            acc = w4a8_accumulators(qx.to(device), t["w.qweight"].to(device), variant=variant, **group_terms)
            out = w4a8_gemm(qx.to(device), s_x.to(device), t["w.qweight"].to(device), t["w.s1_scales"].to(device),
                            variant=variant, **on)
            assert acc.device == out.device == torch.device(device)
            results.append((acc.cpu(), out.cpu()))
    (acc0, out0), (acc1, out1) = results
    assert torch.equal(acc0, acc1)
    assert torch.equal(out0, out1)


@pytest.mark.parametrize("splits", [1, 4])
def test_attention_runs_on_the_gpu_of_its_operands(splits):
    lens, hkv, dim, hq = [1, 700, 2000], 2, 128, 8
    outs = []
    with torch.cuda.device(0):
        for device in ("cuda:0", "cuda:1"):
            q, k_pool, v_pool, table, seq_lens = decode_inputs(lens, hkv, dim, hq // hkv, device)
            out = attention.decode_attention(q, k_pool, v_pool, table, seq_lens, max(lens), num_splits=splits)
            expected = ref.decode_attention(q, k_pool, v_pool, table, seq_lens)
            assert out.device == torch.device(device)
            assert ((out.float() - expected.float()).norm() / expected.float().norm()).item() < 1e-3
            # the KV4 write (RoPE on the new tokens' q and k) on the same GPU
            qkv = torch.randn(4, (hq + 2 * hkv) * dim, generator=torch.Generator().manual_seed(1)).half().to(device)
            positions = torch.tensor([0, 5, 9, 700], device=device)
            slot_ids = torch.tensor([3, 70, 71, 130], device=device)
            angles = torch.arange(1024, device=device).float()[:, None] / 10000 ** (
                torch.arange(0, dim, 2, device=device).float() / dim)
            q_new, k_new = attention.rope_kv4_write(qkv, positions, slot_ids, angles.cos(), angles.sin(), k_pool, v_pool,
                                                    hq, hkv)
            outs.append((out.cpu(), q_new.cpu(), k_new.cpu(), k_pool.cpu(), v_pool.cpu()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_operands_on_two_gpus_are_refused_by_name():
    t = _linear(64, 256, 128)
    qx = torch.zeros(1, 256, dtype=torch.int8, device="cuda:0")
    s_x = torch.ones(1, dtype=torch.float16, device="cuda:0")
    with pytest.raises(ValueError, match="qweight is on cuda:1"):
        w4a8_gemm(qx, s_x, t["w.qweight"].to("cuda:1"), t["w.s1_scales"].to("cuda:0"),
                  s2_scales=t["w.s2_scales"].to("cuda:0"), s2_zeros=t["w.s2_zeros"].to("cuda:0"))
    with pytest.raises(ValueError, match="s1_scales is on cuda:1"):
        w4a8_gemm(qx, s_x, t["w.qweight"].to("cuda:0"), t["w.s1_scales"].to("cuda:1"),
                  s2_scales=t["w.s2_scales"].to("cuda:0"), s2_zeros=t["w.s2_zeros"].to("cuda:0"))
    x = torch.randn(2, 256, device="cuda:0").half()
    with pytest.raises(ValueError, match="weight is on cuda:1"):
        quant_kernels.rmsnorm_quant(x, torch.ones(256, device="cuda:1").half(), 1e-5)
    q, k_pool, v_pool, table, seq_lens = decode_inputs([100], 2, 128, 4, "cuda:0")
    with pytest.raises(ValueError, match="page_table is on cuda:1"):
        attention.decode_attention(q, k_pool, v_pool, table.to("cuda:1"), seq_lens, 100)
