"""Tiny random HF checkpoints for tests that run the whole pipeline (import: `from checkpoints import ...`)."""

from pathlib import Path

import torch


def make_tiny_checkpoint(path: Path, tokenizer, arch: str = "llama", hidden: int = 128, layers: int = 2,
                         intermediate: int = 256, heads: int = 4, kv_heads: int = 2, tied: bool = False,
                         seed: int = 0) -> Path:
    """A random HF checkpoint (safetensors + tokenizer) of a tiny Llama or Qwen2 config."""
    import transformers

    torch.manual_seed(seed)
    cls_cfg, cls_model = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                          "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}[arch]
    cfg = getattr(transformers, cls_cfg)(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=1024, tie_word_embeddings=tied)
    model = getattr(transformers, cls_model)(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
