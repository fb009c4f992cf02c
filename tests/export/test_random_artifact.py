"""Random-weight artifacts: valid (checksums, manifest, config), loadable by the engine, deterministic."""

import pytest

from qoq.engine import LLMEngine, SamplingParams
from qoq.export.artifact import read_artifact
from qoq.export.random_artifact import SHAPES, artifact_weight_bytes, write_random_artifact


@pytest.mark.parametrize("recipe", ["w4a8kv4g128", "fp16"])
def test_tiny_random_artifact_verifies_and_generates(tmp_path, recipe):
    path = write_random_artifact(tmp_path / recipe, "tiny", recipe, tokenizer=None)
    art = read_artifact(path)  # every tensor's checksum, the exact tensor set
    assert art.manifest["recipe"]["name"] == recipe and art.manifest["source"]["random_weights"]
    quantized = {n for n in art.tensors if n.endswith(".qweight")}
    assert len(quantized) == (7 * SHAPES["tiny"]["num_hidden_layers"] if recipe != "fp16" else 0)
    assert art.tensors["lm_head.weight"].dtype == art.tensors["model.norm.weight"].dtype
    qc = art.config.get("quantization_config")
    assert (qc["group_size"], qc["kv_bits"]) == (128, 4) if recipe != "fp16" else qc is None
    assert artifact_weight_bytes(path) == sum(t.numel() * t.element_size() for t in art.tensors.values())
    engine = LLMEngine(path, kv_budget=8 << 20)
    out = engine.generate([[5, 6, 7, 8], [9] * 70], SamplingParams(max_tokens=5, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [5, 5] and engine.tokenizer is None


def test_same_seed_same_tensors(tmp_path):
    a = read_artifact(write_random_artifact(tmp_path / "a", "tiny", "w4a8kv4g128", tokenizer=None, seed=3))
    b = read_artifact(write_random_artifact(tmp_path / "b", "tiny", "w4a8kv4g128", tokenizer=None, seed=3))
    assert a.manifest["tensors"] == b.manifest["tensors"]  # same shapes, dtypes and SHA-256


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="unknown shape"):
        write_random_artifact(tmp_path / "x", "llama-9", "fp16")
    with pytest.raises(ValueError, match="divisible by group|multiples of 32"):
        write_random_artifact(tmp_path / "y", {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 1,
                                               "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64,
                                               "max_position_embeddings": 128, "rope_theta": 1e4}, "w4a8kv4g128",
                              tokenizer=None)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.fixture
def smollm2_tokenizer():
    from qoq.models import smollm2

    try:
        smollm2.gguf_path()
    except smollm2.EmbeddedModelMissing as e:
        if not (smollm2.cache_dir() / "tokenizer.json").exists():
            pytest.skip(str(e))
    return "smollm2-135m"


def test_tokenizer_copied_where_it_fits(tmp_path, smollm2_tokenizer):
    path = write_random_artifact(tmp_path / "tok", "tiny", "w4a8kv4g128", tokenizer=smollm2_tokenizer)
    assert (path / "tokenizer.json").exists()
    out = LLMEngine(path, kv_budget=8 << 20).generate(["Hello there"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4 and isinstance(out[0].text, str)
    with pytest.raises(ValueError, match="more than the shape's vocab_size 32000"):
        write_random_artifact(tmp_path / "l2", "llama-2-7b", "fp16", tokenizer=smollm2_tokenizer)
