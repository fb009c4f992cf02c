"""Sampling on the logits' device: greedy, temperature, top-k, top-p, with a torch.Generator per request.

A request's random draws come only from its own generator (one uniform vector per token), so a seed
gives the same tokens whatever else is in the batch, and whether or not the request was preempted.
"""

from __future__ import annotations

import torch

from qoq.engine.params import SamplingParams

_seed_source = torch.Generator().manual_seed(0x5EED)


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator:
    seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=_seed_source))
    return torch.Generator(device=device).manual_seed(seed)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] fp32 (already divided by the temperature) with everything outside top-k / top-p at -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly above each token
        drop = before >= top_p  # the top token always stays
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """logits [B, V] (any float dtype) -> one token id per row: one argmax for every row (the greedy rows
    keep theirs), each sampled row drawn with its own generator, one copy of the ids to the host."""
    logits = logits.float()
    tokens = logits.argmax(-1)
    for i, p in enumerate(params):
        if p.temperature == 0:  # greedy
            continue
        row = filter_logits(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        # exponential race: argmax p / E with E ~ Exp(1) draws from p (E from one uniform vector)
        u = torch.rand(probs.shape, generator=generators[i], device=probs.device)
        race = probs / (-torch.log1p(-u)).clamp_min(1e-20)
        tokens[i] = race.argmax()
    return tokens.tolist()
