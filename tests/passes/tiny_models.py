"""Tiny random CausalLMs shared by the pass tests (exactness checks run passes on them in fp32)."""

import torch

from qoq.models.config import ModelConfig
from qoq.models.llama import CausalLM

TINY = {
    # SmolLM2-like widths: hidden 576 = 9 heads x 64, 3 KV heads (GQA), tied embeddings
    "llama-576-gqa-tied": {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
                           "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                           "tie_word_embeddings": True},
    "qwen2-bias": {"model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False},
}


def random_lm(extra: dict) -> CausalLM:
    torch.manual_seed(0)
    hf = {"vocab_size": 256, "num_hidden_layers": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 128, **extra}
    lm = CausalLM(ModelConfig.from_hf(hf)).eval()
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)  # non-trivial gammas
    return lm
