"""Sampling on the logits' device, one batched pass: greedy, temperature, top-k, top-p, per-request seeds.

Every sampled row draws from one vector of uniforms made by a counter-based hash of (its request's seed,
the index of the token being drawn, the vocabulary index): splitmix64 in int64 torch ops, exact on every
device. A draw therefore depends on nothing else in the batch, on no generator state, and not on how
often the request was preempted (its counter is the number of tokens it has generated), so a seed gives
the same tokens alone or batched. The work is a fixed number of kernels whatever the batch (no per-row
loop): a server's default request (temperature 1, as OpenAI's API) costs no more host time than greedy.
"""

from __future__ import annotations

import torch

from qoq.engine.params import SamplingParams

_seed_source = torch.Generator().manual_seed(0x5EED)

# splitmix64's constants as signed int64 (torch has no uint64 arithmetic; products wrap the same way)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)


def request_seed(params: SamplingParams) -> int:
    """The seed a request draws with: its own, or one drawn for it (once, at its first sampled token)."""
    return params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=_seed_source))


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [R, vocab] in (0, 1): row r's uniforms for draw number counters[r] of seed seeds[r]
    (int64 [R] on the target device); 23 random bits each, (bits + 1/2) / 2^23: exact in float32, never 0 or 1."""
    key = _mix(seeds + (counters + 1) * _GOLDEN)  # [R]: one splitmix64 stream per (seed, draw)
    index = torch.arange(1, vocab + 1, device=seeds.device, dtype=torch.int64)
    bits = _shr(_mix(key[:, None] + index * _GOLDEN), 41)  # the top 23 bits
    return (bits.float() + 0.5) * (1.0 / (1 << 23))


def filter_logits(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    """logits [V] or [R, V] fp32 (already divided by the temperature) with everything outside each row's
    top-k (0: off) and top-p (1: off) at -inf; top_k / top_p are numbers or per-row tensors."""
    one = logits.dim() == 1
    x = logits[None] if one else logits
    rows, vocab = x.shape
    k = torch.as_tensor(top_k, device=x.device).reshape(-1).expand(rows)
    p = torch.as_tensor(top_p, device=x.device, dtype=torch.float32).reshape(-1).expand(rows)
    k = torch.where(k > 0, k.clamp(max=vocab), vocab)
    sorted_x, order = x.sort(-1, descending=True)
    rank = torch.arange(vocab, device=x.device)
    probs = sorted_x.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly above each token
    drop = (rank[None] >= k[:, None]) | ((before >= p[:, None]) & (p[:, None] < 1))  # the top token stays
    out = torch.empty_like(x).scatter_(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return out[0] if one else out


def sample(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int | None],
           counters: list[int]) -> list[int]:
    """logits [B, V] (any float dtype) -> one token id per row. Greedy rows take the argmax; each sampled
    row (temperature > 0) draws with the exponential race argmax(log p - log E), E = -log u, u its
    uniforms for (seeds[i], counters[i]). One copy of the ids to the host."""
    logits = logits.float()
    tokens = logits.argmax(-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens.tolist()
    dev = logits.device
    picked = [params[i] for i in rows]
    ints = torch.tensor([[seeds[i] for i in rows], [counters[i] for i in rows], [p.top_k for p in picked], rows],
                        dtype=torch.int64).to(dev, non_blocking=True)
    floats = torch.tensor([[p.temperature for p in picked], [p.top_p for p in picked]],
                          dtype=torch.float32).to(dev, non_blocking=True)
    index = ints[3] if len(rows) < len(params) else None
    x = (logits if index is None else logits[index]) / floats[0][:, None]
    if any(p.top_k or p.top_p < 1.0 for p in picked):
        x = filter_logits(x, ints[2], floats[1])
    u = uniforms(ints[0], ints[1], x.shape[-1])
    drawn = (x.log_softmax(-1) - torch.log(-torch.log(u))).argmax(-1)
    if index is None:
        tokens = drawn
    else:
        tokens[index] = drawn
    return tokens.tolist()
