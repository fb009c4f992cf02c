"""Sampler: greedy, top-k / top-p filtering, seeded draws that follow the distribution."""

import torch

from qoq.engine.params import SamplingParams
from qoq.engine.sampler import filter_logits, make_generator, sample


def test_greedy_is_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, -1.0, 4.9]])
    assert sample(logits, [SamplingParams(), SamplingParams()], [None, None]) == [1, 0]


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    kept = lambda x: torch.isfinite(x).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, 2, 1.0)) == [0, 1]
    assert kept(filter_logits(logits, 0, 0.7)) == [0, 1]  # 0.5 < 0.7 needs the next token too
    assert kept(filter_logits(logits, 0, 0.71)) == [0, 1, 2]
    assert kept(filter_logits(logits, 0, 0.3)) == [0]
    shuffled = logits[torch.tensor([3, 0, 4, 2, 1])]
    assert kept(filter_logits(shuffled, 0, 0.71)) == [1, 3, 4]


def test_seeded_sampling_reproduces_and_follows_probabilities():
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    logits = torch.log(probs)[None]
    p = SamplingParams(temperature=1.0, seed=3)
    g = make_generator(p, torch.device("cpu"))
    draws = [sample(logits, [p], [g])[0] for _ in range(4000)]
    g2 = make_generator(p, torch.device("cpu"))
    assert [sample(logits, [p], [g2])[0] for _ in range(50)] == draws[:50]
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    assert (freq - probs).abs().max() < 0.03 and freq[3] == 0


def test_row_draws_do_not_depend_on_other_rows():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=0.9, top_k=20, seed=11)
    q = SamplingParams(temperature=1.3, seed=12)
    cpu = torch.device("cpu")
    alone = [sample(logits[1:2], [p], [make_generator(p, cpu)])[0]]
    together = sample(logits, [q, p, SamplingParams()], [make_generator(q, cpu), make_generator(p, cpu), None])
    assert together[1] == alone[0] and together[2] == int(logits[2].argmax())
