"""Tiny random HF checkpoints for tests that run the whole pipeline (import: `from checkpoints import ...`)."""

from pathlib import Path

import torch


def make_tiny_checkpoint(path: Path, tokenizer, arch: str = "llama", hidden: int = 128, layers: int = 2,
                         intermediate: int = 256, heads: int = 4, kv_heads: int = 2, tied: bool = False,
                         seed: int = 0, perturb: bool = False) -> Path:
    """A random HF checkpoint (safetensors + tokenizer) of a tiny Llama or Qwen2 config.

    perturb: norm weights 1 + N(0, 0.2) and biases N(0, 0.2) instead of HF's ones and zeros, so a pass that
    drops or mishandles them shows."""
    import transformers

    torch.manual_seed(seed)
    cls_cfg, cls_model = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                          "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}[arch]
    cfg = getattr(transformers, cls_cfg)(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=1024, tie_word_embeddings=tied)
    model = getattr(transformers, cls_model)(cfg)
    if perturb:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1 + 0.2 * torch.randn_like(p))
                elif name.endswith(".bias"):
                    p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def set_qwen_like_k_bias(path: Path, layer: int = 0, head_dim: int = 32) -> Path:
    """Give one layer of a tiny Qwen2 checkpoint k_proj biases like Qwen2.5's first layer: ±150 in a few
    channels, the lowest-frequency RoPE pair among them."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    half = head_dim // 2
    bias = tensors[f"model.layers.{layer}.self_attn.k_proj.bias"].view(-1, head_dim)
    bias[:, half - 1], bias[:, head_dim - 1], bias[:, 2] = 150.0, -150.0, 60.0
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path
