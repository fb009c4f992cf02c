"""Our CausalLM against transformers on tiny random checkpoints, loaded through our loader."""

import pytest
import torch

from qoq.models import CheckpointError, CheckpointReader, ModelConfig, load_block, load_model, load_skeleton

LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
}  # fmt: skip
CASES = {
    "llama_mha": ("llama", {}),
    "llama_gqa": ("llama", {"num_key_value_heads": 2}),
    "llama_attention_bias": ("llama", {"num_key_value_heads": 2, "attention_bias": True}),
    "llama_tied": ("llama", {"tie_word_embeddings": True}),
    "llama3_rope_scaling": ("llama", {"num_key_value_heads": 1, "rope_parameters": LLAMA3_ROPE}),
    "qwen2_bias_gqa": ("qwen2", {"num_key_value_heads": 2}),
    "qwen2_tied": ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    "mistral_head_dim": ("mistral", {"num_key_value_heads": 2, "head_dim": 32, "sliding_window": 4096}),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def input_ids(vocab: int, batch: int = 2, seq: int = 40) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(save_tiny, case):
    model_type, overrides = CASES[case]
    path, hf = save_tiny(model_type, **overrides)
    ours, config = load_model(path)
    ids = input_ids(config.vocab_size)
    with torch.inference_mode():
        expected = hf(ids).logits
        got = ours(ids)
    assert got.shape == expected.shape == (2, 40, config.vocab_size)
    assert expected.std() > 0.5  # logits far from zero: the comparison has teeth
    assert rel_err(got, expected) < 1e-5


def test_config_fields_from_saved_dir(save_tiny):
    path, _ = save_tiny("qwen2", num_key_value_heads=2, tie_word_embeddings=True)
    config = ModelConfig.from_hf(CheckpointReader(path).config())
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.num_layers) == (4, 2, 16, 2)
    assert config.attention_bias and not config.o_proj_bias and config.tie_word_embeddings
    assert "lm_head.weight" not in CheckpointReader(path).names()  # the loader had to tie it itself


def test_state_dict_keys_are_hf_names(save_tiny):
    path, hf = save_tiny("llama", num_key_value_heads=2, attention_bias=True)
    ours, _ = load_model(path)
    assert set(ours.state_dict()) == set(hf.state_dict())
    assert "model.layers.1.self_attn.o_proj.bias" in ours.state_dict()


def test_block_by_block_matches_full_forward(save_tiny):
    path, _ = save_tiny("llama", num_key_value_heads=2, tie_word_embeddings=True)
    full, config = load_model(path)
    reader = CheckpointReader(path)
    skeleton = load_skeleton(reader, config)
    assert all(p.is_meta for p in skeleton.layers.parameters())
    assert skeleton.lm_head.weight is skeleton.model.embed_tokens.weight

    read: list[str] = []
    real_tensor = reader.tensor
    reader.tensor = lambda name: read.append(name) or real_tensor(name)
    ids = input_ids(config.vocab_size)
    with torch.inference_mode():
        h = skeleton.embed(ids)
        positions = skeleton.position_ids(ids.shape[1])
        for i in range(config.num_layers):
            read.clear()
            h = load_block(reader, config, i)(h, positions)  # streamed: one block in memory at a time
            assert read and all(name.startswith(f"model.layers.{i}.") for name in read)
        streamed = skeleton.head(h)
        assert torch.equal(streamed, full(ids))


def test_sharded_checkpoint_loads_the_same(tmp_path, make_tiny):
    hf = make_tiny("llama", num_key_value_heads=2)
    hf.save_pretrained(tmp_path / "single")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    single, config = load_model(tmp_path / "single")
    sharded, _ = load_model(tmp_path / "sharded")
    ids = input_ids(config.vocab_size)
    with torch.inference_mode():
        assert torch.equal(sharded(ids), single(ids))
    shards[-1].unlink()
    with pytest.raises(CheckpointError, match=shards[-1].name):
        load_model(tmp_path / "sharded")
