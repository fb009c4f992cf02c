"""Rotate-half (neox) RoPE, as in HF Llama, including the Llama-3 frequency scaling."""

from __future__ import annotations

import math

import torch

from qoq.models.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """fp32 [D/2] inverse frequencies; matches transformers' default and `_compute_llama3_parameters`."""
    dim = config.head_dim
    # explicit device: the table stays real even when the model is built under torch.device("meta")
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    if config.rope_scaling is None:
        return inv_freq
    return _llama3_scaled(inv_freq, config.rope_scaling)


def _llama3_scaled(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high

    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated smoothly
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryTable:
    """Computes cos/sin for given positions. A plain object, not a Module: `.to(dtype)` or a meta-device
    build must never touch the fp32 frequencies."""

    def __init__(self, config: ModelConfig):
        self.inv_freq = inverse_frequencies(config)  # [D/2] fp32, CPU
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [T] or [B, T] -> fp32 cos, sin [T, D] or [B, T, D]."""
        device = position_ids.device
        if device not in self._on_device:
            self._on_device[device] = self.inv_freq.to(device)
        freqs = position_ids[..., None].float() * self._on_device[device]  # [..., T, D/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [..., T, D]
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [T, D] or [B, T, D] (any dtype; cast to x's like HF does)."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]: broadcast over heads
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin
