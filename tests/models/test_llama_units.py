import pytest
import torch
from torch import nn

from qoq.models import CausalLM, ModelConfig, RMSNorm

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=128,
    attention_bias=False, tie_word_embeddings=False, model_type="llama",
)  # fmt: skip


def tiny_model(**kw) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(ModelConfig(**{**TINY, **kw})).eval()


def ids(seq: int = 12) -> torch.Tensor:
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(3))


def test_rmsnorm_is_true_rms_norm_in_fp32():
    norm = RMSNorm(8, eps=1e-6)
    norm.weight.data = torch.arange(1.0, 9.0)
    x = torch.tensor([[3.0, -1.0, 4.0, 1.0, -5.0, 9.0, 2.0, 6.0]]) + 100  # a mean-subtracting norm differs
    rms = (x.double().pow(2).mean() + 1e-6).sqrt()
    expected = (x.double() / rms * norm.weight.double()).float()
    assert torch.allclose(norm(x), expected, rtol=1e-6)
    assert norm(x.half()).dtype == torch.float16


def test_block_accepts_flat_and_batched_positions():
    block = tiny_model().layers[0]
    h = torch.randn(2, 7, 64)
    assert torch.equal(block(h, torch.arange(7)), block(h, torch.arange(7).expand(2, 7)))


def test_causal_prefix_logits_do_not_see_the_future():
    model = tiny_model()
    x = ids()
    with torch.inference_mode():
        full, prefix = model(x), model(x[:, :5])
    assert torch.allclose(full[:, :5], prefix, rtol=1e-5, atol=1e-5)


def test_kv_quant_sees_post_rope_k_and_v_per_kv_head():
    model = tiny_model()
    seen = []

    def record(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.shape)
        return t

    x = ids()
    with torch.inference_mode():
        reference = model(x)
        model.layers[0].self_attn.kv_quant = record
        assert torch.equal(model(x), reference)  # an identity hook changes nothing
        assert seen == [(2, 2, 12, 16)] * 2  # K then V, [B, H_kv, T, D]
        model.layers[0].self_attn.kv_quant = lambda t: t.half().float() + 0.05
        assert not torch.allclose(model(x), reference, atol=1e-3)


def test_any_linear_can_be_replaced_by_a_module():
    class Doubled(nn.Module):  # a quantized linear looks like this: forward(x) -> y, no .weight
        def __init__(self, linear: nn.Linear):
            super().__init__()
            self.inner = linear

        def forward(self, x):
            return 2 * self.inner(x)

    model = tiny_model()
    x = ids()
    with torch.inference_mode():
        reference = model(x)
        model.lm_head = Doubled(model.lm_head)
        for block in model.layers:
            for parent in (block.self_attn, block.mlp):
                for name, child in list(parent.named_children()):
                    if isinstance(child, nn.Linear):
                        setattr(parent, name, nn.Sequential(Doubled(child), nn.Identity()))
        assert not torch.allclose(model(x), reference)


@pytest.mark.parametrize("tied", [False, True])
def test_fp16_forward_tracks_fp32(tied):
    model = tiny_model(tie_word_embeddings=tied)
    x = ids()
    with torch.inference_mode():
        reference = model(x)
        half = model.half()(x)
    assert half.dtype == torch.float16
    assert ((half.float() - reference).norm() / reference.norm()).item() < 5e-3


def test_untie_embeddings_copies_the_weight():
    model = tiny_model(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.untie_embeddings()
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert not model.config.tie_word_embeddings and model.config.hf["tie_word_embeddings"] is False


def test_k_bias_outside_the_kv4_cache():
    """Attention.k_bias_outside_cache: exact without quantization; under KV4 with Qwen2.5-like k biases
    (±150 in a few channels) the keys keep their resolution and the output stays near the float one."""
    from tests.passes.tiny_models import TINY, random_lm

    from qoq.quant.kv import fake_quant_kv

    lm = random_lm(TINY["qwen2-bias"])
    attn = lm.model.layers[0].self_attn
    with torch.no_grad():
        attn.k_proj.bias.view(2, 32)[:, [2, 15, 31]] = torch.tensor([60.0, 150.0, -150.0])
    x = torch.randn(1, 48, 128)
    pos = torch.arange(48)[None]
    with torch.no_grad():
        want = attn(x, pos)
        attn.kv_quant, attn.k_bias_outside_cache = (lambda t: t), True
        assert torch.allclose(attn(x, pos), want, rtol=1e-4, atol=1e-4)
        errors = {}
        for outside in (False, True):
            attn.kv_quant, attn.k_bias_outside_cache = fake_quant_kv, outside
            errors[outside] = ((attn(x, pos) - want).norm() / want.norm()).item()
    assert errors[True] < 0.5 * errors[False], errors
