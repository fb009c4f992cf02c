"""Accuracy evaluation of any callable model `input_ids [B, T] -> logits [B, T, V]`.

`perplexity`: WikiText-2 perplexity (docs/design.md §6). `lm_eval_adapter`: lm-eval tasks (needs `lm-eval`).
"""

from __future__ import annotations

import torch


def model_device(model) -> torch.device:
    """Where to put input ids: the model's `device` (a torch.device attribute, as the engine's scoring
    callable has), else the device of its first parameter, else the CPU."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    parameters = getattr(model, "parameters", None)
    if parameters is not None:
        for parameter in parameters():
            return parameter.device
    return torch.device("cpu")
