import torch

from qoq.models.config import ModelConfig
from qoq.models.llama import Block
from qoq.passes.capture import capture_inputs, input_abs_max

CFG = ModelConfig.from_hf({
    "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 64})


def test_capture_subsamples_the_same_rows_and_max_matches():
    torch.manual_seed(0)
    block, h, pos = Block(CFG), torch.randn(9, 16, 64), torch.arange(16)
    full = capture_inputs(block, h, pos, ["mlp.down_proj", "self_attn.q_proj"])
    assert full["mlp.down_proj"].shape == (144, 128) and full["self_attn.q_proj"].shape == (144, 64)
    some = capture_inputs(block, h, pos, ["mlp.down_proj"], max_tokens=50, seed=3)
    keep = torch.randperm(144, generator=torch.Generator().manual_seed(3))[:50].sort().values
    assert torch.equal(some["mlp.down_proj"], full["mlp.down_proj"][keep])
    stats = input_abs_max(block, h, pos, ["mlp.down_proj"])
    assert torch.equal(stats["mlp.down_proj"], full["mlp.down_proj"].abs().amax(0))
    # q_proj sees the normed block input: its rows have RMS ~ 1 (gamma = 1)
    rms = full["self_attn.q_proj"].pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
