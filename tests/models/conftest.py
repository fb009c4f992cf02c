import time
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    initializer_range=0.1,
)  # fmt: skip


def tiny_hf_model(model_type: str, **overrides):
    """A seeded random HF model; norms and biases perturbed too, so they cannot be silently ignored."""
    config = AutoConfig.for_model(model_type, **{**TINY, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture
def make_tiny():
    return tiny_hf_model


@pytest.fixture
def save_tiny(tmp_path):
    def save(model_type: str, **overrides) -> tuple[Path, torch.nn.Module]:
        model = tiny_hf_model(model_type, **overrides)
        out = tmp_path / model_type
        model.save_pretrained(out)
        return out, model

    return save


@pytest.fixture(scope="session")
def smollm2_dir():
    """The converted embedded default (cached in $QOQ_CACHE_DIR or ~/.cache/qoq); prints the conversion time."""
    from qoq.models import smollm2

    try:
        smollm2.gguf_path()
    except smollm2.EmbeddedModelMissing as e:
        pytest.skip(str(e))
    start = time.perf_counter()
    path = smollm2.ensure_converted()
    print(f"\nsmollm2-135m ready at {path} in {time.perf_counter() - start:.1f} s")
    return path
