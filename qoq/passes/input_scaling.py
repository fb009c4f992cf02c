"""Per-input-channel scaling that keeps a block's float function (SmoothQuant, AWQ): a linear input X
divided by s, and the columns of every linear reading X multiplied by s. The division is folded into
what produces X: an RMSNorm's γ (q/k/v, gate/up) or up_proj's rows (down_proj: X = SiLU(gate)·up is
linear in up's output). Exact in float; only quantization sees the change."""

from __future__ import annotations

import torch

# shared input owner (capture.SHARED_INPUT) -> (the module producing the input, the linears reading it)
SCALABLE_INPUTS = {
    "self_attn.q_proj": ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "mlp.gate_proj": ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
    "mlp.down_proj": ("mlp.up_proj", ("mlp.down_proj",)),
}


def reader_weights(block: torch.nn.Module, owner: str) -> list[torch.Tensor]:
    """fp32 copies [N, K] of the weights of the linears reading `owner`'s input."""
    return [block.get_submodule(n).weight.detach().float() for n in SCALABLE_INPUTS[owner][1]]


@torch.no_grad()
def fold_input_scales(block: torch.nn.Module, owner: str, s: torch.Tensor) -> None:
    """X ← X / s (into the producer), W[:, j] ← W[:, j]·s_j for every reader; s [K] positive."""
    producer_name, readers = SCALABLE_INPUTS[owner]
    producer = block.get_submodule(producer_name)
    if producer_name == "mlp.up_proj":
        producer.weight.div_(s.to(producer.weight)[:, None])
        if producer.bias is not None:
            producer.bias.div_(s.to(producer.bias))
    else:  # an RMSNorm: y = x̂·γ
        producer.weight.div_(s.to(producer.weight))
    for name in readers:
        w = block.get_submodule(name).weight
        w.mul_(s.to(w)[None, :])
