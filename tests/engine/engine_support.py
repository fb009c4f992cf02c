"""What the engine tests share (imported by path: each tests/ folder has its own conftest module)."""

import dataclasses


def small(name: str):
    from qoq.recipe import Calibration, load_recipe

    return dataclasses.replace(load_recipe(name), calibration=Calibration(samples=4, seq_len=128, seed=42))


TINY_PAGE_BYTES = 10240

PROMPTS = [
    list(range(5, 5 + 7)),
    list(range(40, 40 + 70)),  # more than a page
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5],
    list(range(200, 200 + 30)),
    [17],
]


def assert_same_until_near_tie(a, b, margin):
    """Greedy tokens equal up to the first position whose top-2 logits (in run a) are within margin."""
    for i, (x, y, logits) in enumerate(zip(a.token_ids, b.token_ids, a.logits)):
        top2 = logits.topk(2).values
        if (top2[0] - top2[1]).item() < margin:
            return i
        assert x == y, f"token {i}: {x} != {y} with a top-2 gap of {(top2[0] - top2[1]).item():.4f}"
    return len(a.token_ids)


def assert_same_until_possible_flip(a, b):
    """Greedy tokens equal up to the first position where b's logits differ from a's enough to change the
    argmax: a's top-2 gap at most twice the largest |logit difference| there (a flip needs the two
    logits to move towards each other by the whole gap). Returns that position (or the length)."""
    for i, (x, y, la, lb) in enumerate(zip(a.token_ids, b.token_ids, a.logits, b.logits)):
        top2 = la.topk(2).values
        if (top2[0] - top2[1]).item() <= 2 * (la - lb).abs().max().item():
            return i
        assert x == y, f"token {i}: {x} != {y} with a top-2 gap of {(top2[0] - top2[1]).item():.4f}"
    return len(a.token_ids)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()
