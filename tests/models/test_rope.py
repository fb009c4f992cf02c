import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from qoq.models import ModelConfig
from qoq.models.rope import RotaryTable, apply_rope, inverse_frequencies, rotate_half

LLAMA31_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
}  # fmt: skip


def hf_config(**kw) -> LlamaConfig:
    return LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, **kw)


def test_llama3_frequencies_equal_transformers():
    hf = hf_config(rope_parameters=LLAMA31_ROPE, max_position_embeddings=131072)
    expected, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    ours = inverse_frequencies(ModelConfig.from_hf(hf))
    assert attention_factor == 1.0 and ours.shape == (64,)
    assert torch.equal(ours, expected)
    unscaled = inverse_frequencies(ModelConfig.from_hf(hf_config(rope_theta=500000.0)))
    changed = (ours != unscaled).sum().item()
    assert 0 < changed < 64  # low and medium frequencies rescaled, high ones kept


def test_default_frequencies_equal_transformers():
    hf = hf_config(rope_theta=10000.0)
    expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    inv = inverse_frequencies(ModelConfig.from_hf(hf))
    assert torch.equal(inv, expected)
    assert abs(inv[1].item() / 10000 ** (-2 / 128) - 1) < 1e-6


def test_apply_rope_is_a_rotation_and_batched_positions_match():
    config = ModelConfig.from_hf(hf_config(rope_theta=10000.0))
    table = RotaryTable(config)
    x = torch.randn(2, 3, 5, 128, generator=torch.Generator().manual_seed(0))  # [B, H, T, D]
    cos, sin = table.cos_sin(torch.arange(5))  # [T, D]
    y = apply_rope(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)  # pairs (i, i + D/2) rotate
    assert torch.equal(y[:, :, 0], x[:, :, 0])  # position 0 is the identity
    batched = table.cos_sin(torch.arange(5).expand(2, 5))  # [B, T, D]
    assert torch.equal(apply_rope(x, *batched), y)
    assert torch.equal(rotate_half(rotate_half(x)), -x)
