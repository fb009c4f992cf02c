"""Sampler: greedy, top-k / top-p filtering, seeded draws that follow the distribution, batched."""

import pytest
import torch

from qoq.engine.params import SamplingParams
from qoq.engine.sampler import filter_logits, sample, uniforms


def test_greedy_is_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, -1.0, 4.9]])
    assert sample(logits, [SamplingParams(), SamplingParams()], [None, None], [0, 0]) == [1, 0]


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    kept = lambda x: torch.isfinite(x).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, 2, 1.0)) == [0, 1]
    assert kept(filter_logits(logits, 0, 0.7)) == [0, 1]  # 0.5 < 0.7 needs the next token too
    assert kept(filter_logits(logits, 0, 0.71)) == [0, 1, 2]
    assert kept(filter_logits(logits, 0, 0.3)) == [0]
    assert kept(filter_logits(logits, 0, 1.0)) == [0, 1, 2, 3, 4]
    assert kept(filter_logits(logits, 9, 1.0)) == [0, 1, 2, 3, 4]  # k over the vocabulary: off
    shuffled = logits[torch.tensor([3, 0, 4, 2, 1])]
    assert kept(filter_logits(shuffled, 0, 0.71)) == [1, 3, 4]


def test_batched_filter_applies_each_rows_own_settings():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])).repeat(3, 1)
    out = filter_logits(logits, torch.tensor([2, 0, 4]), torch.tensor([1.0, 0.71, 0.3]))
    assert torch.isfinite(out).sum(-1).tolist() == [2, 3, 1]
    assert torch.equal(out[0, :2], logits[0, :2])  # kept logits are untouched


def test_uniforms_are_uniform_and_independent():
    seeds = torch.tensor([7, 7, 8], dtype=torch.int64)
    u = uniforms(seeds, torch.tensor([0, 1, 0]), 200_000)
    assert u.min() > 0 and u.max() < 1 and u.dtype == torch.float32
    for row in u:
        assert abs(row.mean().item() - 0.5) < 0.005 and abs(row.var().item() - 1 / 12) < 0.002
        counts = torch.histc(row, bins=20, min=0, max=1)
        chi2 = ((counts - row.numel() / 20) ** 2 / (row.numel() / 20)).sum().item()
        assert chi2 < 45  # 19 degrees of freedom: p ~ 1e-3
    # neighbouring draws, neighbouring seeds and neighbouring vocabulary entries are uncorrelated
    c = torch.corrcoef(torch.stack([u[0, :-1], u[1, :-1], u[2, :-1], u[0, 1:]]))
    assert c.fill_diagonal_(0).abs().max() < 0.01
    assert torch.equal(uniforms(seeds, torch.tensor([0, 1, 0]), 1000), u[:, :1000])  # a pure function


def test_seeded_sampling_reproduces_and_follows_probabilities():
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    logits = torch.log(probs)[None]
    p = SamplingParams(temperature=1.0, seed=3)
    draws = [sample(logits, [p], [3], [i])[0] for i in range(4000)]
    assert [sample(logits, [p], [3], [i])[0] for i in range(50)] == draws[:50]
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    assert (freq - probs).abs().max() < 0.03 and freq[3] == 0
    other = [sample(logits, [p], [4], [i])[0] for i in range(50)]
    assert other != draws[:50]


def test_temperature_and_top_k_shape_the_draws():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))[None]
    hot = SamplingParams(temperature=2.0, seed=1)
    draws = torch.tensor([sample(logits, [hot], [1], [i])[0] for i in range(4000)])
    expected = torch.softmax(logits[0] / 2.0, -1)
    assert (torch.bincount(draws, minlength=3).float() / 4000 - expected).abs().max() < 0.03
    top1 = SamplingParams(temperature=1.0, top_k=1, seed=1)
    assert {sample(logits, [top1], [1], [i])[0] for i in range(100)} == {0}


def test_row_draws_do_not_depend_on_other_rows():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=0.9, top_k=20, seed=11)
    q = SamplingParams(temperature=1.3, seed=12)
    for counter in range(20):
        alone = sample(logits[1:2], [p], [11], [counter])
        together = sample(logits, [q, p, SamplingParams()], [12, 11, None], [5, counter, 0])
        assert together[1] == alone[0] and together[2] == int(logits[2].argmax())


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_sampled_batch_costs_the_same_ops_at_any_size(top_p):
    """No per-row loop: the number of torch ops a step's sampling runs does not grow with the batch."""
    def ops(batch: int) -> int:
        logits = torch.randn(batch, 64)
        params = [SamplingParams(temperature=1.0, top_p=top_p, seed=i) for i in range(batch)]
        params[0] = SamplingParams()  # one greedy row among them
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            sample(logits, params, [None] + list(range(1, batch)), [3] * batch)
        return sum(1 for e in prof.events() if e.name.startswith("aten::"))

    small, large = ops(3), ops(96)
    assert small == large, (small, large)


def test_uniforms_match_a_python_splitmix64():
    """The int64 torch arithmetic is splitmix64's uint64 arithmetic (checked against Python integers)."""
    mask = (1 << 64) - 1

    def mix(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    seed, counter = 123456789123, 41
    key = mix((seed + (counter + 1) * 0x9E3779B97F4A7C15) & mask)
    want = [((mix((key + v * 0x9E3779B97F4A7C15) & mask) >> 41) + 0.5) / (1 << 23) for v in range(1, 9)]
    got = uniforms(torch.tensor([seed]), torch.tensor([counter]), 8)[0].tolist()
    assert got == want  # bit for bit: 23 bits and a half fit float32's mantissa
