"""The CPU engine on tiny random artifacts: what `qoq eval` computes, batch invariance, preemption,
chunked prefill, aborts, seeds, stop rules."""

import pytest
import torch

from tests.engine.engine_support import PROMPTS, TINY_PAGE_BYTES
from qoq.engine import SamplingParams
from qoq.executor import load_artifact_model

def executor_greedy(artifact, prompt, n):
    """Greedy decoding by full recompute through the executor's model (what `qoq eval` runs)."""
    lm, _ = load_artifact_model(artifact)
    ids, logits = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            last = lm(torch.tensor([ids]))[0, -1]
            logits.append(last)
            ids.append(int(last.argmax()))
    return ids[len(prompt):], logits


@pytest.mark.parametrize("artifact", ["tiny_w4", "tiny_fp16", "tiny_qwen_k_bias"])
def test_engine_equals_executor_greedy(request, make_engine, artifact):
    art = request.getfixturevalue(artifact)
    engine = make_engine(art, record_logits=True)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = engine.generate(PROMPTS[:3], params)
    for prompt, out in zip(PROMPTS[:3], outs):
        expected, expected_logits = executor_greedy(art, prompt, 12)
        assert out.token_ids == expected
        assert out.finish_reason == "length"
        for got, want in zip(out.logits, expected_logits):
            assert ((got - want).norm() / want.norm()).item() < 1e-5


def _run_alone(make_engine, art, prompts, params):
    engine = make_engine(art, record_logits=True)
    return [engine.generate([p], params)[0] for p in prompts]


def test_batch_invariance_staggered_preempted_chunked(make_engine, tiny_w4):
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    alone = _run_alone(make_engine, tiny_w4, PROMPTS, params)
    # they need 2 + 3 + 2 + 2 + 1 pages; 4 usable pages (+1 scratch) force preemptions
    engine = make_engine(tiny_w4, kv_budget=5 * TINY_PAGE_BYTES, max_num_batched_tokens=48, record_logits=True)
    ids, done = {}, {}
    for step in range(10_000):
        if step in (0, 2, 5, 9, 14):  # staggered admission
            i = len(ids)
            ids[engine.add_request(PROMPTS[i], params)] = i
        for out in engine.step():
            done.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
        if len(ids) == len(PROMPTS) and not engine.has_unfinished():
            break
    assert engine.scheduler.num_preemptions > 0
    for i, ref in enumerate(alone):
        assert done[i] == ref.token_ids, f"prompt {i}"


def test_chunked_prefill_equals_whole_prefill(make_engine, tiny_w4):
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    whole = make_engine(tiny_w4, record_logits=True).generate([PROMPTS[1]], params)[0]
    chunked_engine = make_engine(tiny_w4, max_num_batched_tokens=16, record_logits=True)
    chunked = chunked_engine.generate([PROMPTS[1]], params)[0]
    assert chunked.token_ids == whole.token_ids
    assert chunked_engine.stats["steps"] == -(-len(PROMPTS[1]) // 16) + 7  # 5 prefill chunks, then 7 decodes
    for a, b in zip(chunked.logits, whole.logits):
        assert ((a - b).norm() / b.norm()).item() < 1e-5


def test_abort_frees_pages_and_reports(make_engine, tiny_w4):
    engine = make_engine(tiny_w4)
    total = engine.blocks.num_free_pages
    a = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=50, ignore_eos=True))
    b = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    assert engine.blocks.num_free_pages == total - 3  # 70 tokens: 2 pages; 7 tokens: 1
    assert engine.abort(a) and not engine.abort(a)
    assert engine.blocks.num_free_pages == total - 1
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    aborted = [o for o in outs if o.request_id == a]
    assert len(aborted) == 1 and aborted[0].finish_reason == "abort" and aborted[0].finished
    assert sum(len(o.new_token_ids) for o in outs if o.request_id == b) == 2  # 1 came with the first step


def test_abort_while_waiting(make_engine, tiny_w4):
    engine = make_engine(tiny_w4, max_num_seqs=1)
    a = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=4, ignore_eos=True))
    b = engine.add_request(PROMPTS[2], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert [s.seq_id for s in engine.scheduler.waiting] == [b]
    assert engine.abort(b)
    outs = engine.generate([PROMPTS[3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(outs[0].token_ids) == 2
    assert engine.sequence(a) is None  # finished and forgotten


def test_seed_gives_same_tokens_in_any_batch(make_engine, tiny_w4):
    engine = make_engine(tiny_w4)
    p = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, top_k=50, seed=7, ignore_eos=True)
    alone = engine.generate([PROMPTS[2]], p)[0].token_ids
    others = SamplingParams(max_tokens=16, temperature=0.8, seed=1, ignore_eos=True)
    batched = engine.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1]], [others, p, others])[1].token_ids
    assert batched == alone
    other_seed = engine.generate([PROMPTS[2]], SamplingParams(**{**p.__dict__, "seed": 8}))[0].token_ids
    assert other_seed != alone
    greedy = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    assert greedy != alone  # temperature 1 on a random model really samples


def test_stop_token_and_length(make_engine, tiny_w4):
    engine = make_engine(tiny_w4)
    free_run = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    stop_at = free_run.token_ids[4]
    first = free_run.token_ids.index(stop_at)
    out = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=10, stop_token_ids=[stop_at], ignore_eos=True))[0]
    assert out.token_ids == free_run.token_ids[: first + 1] and out.finish_reason == "stop"
    assert free_run.finish_reason == "length" and len(free_run.token_ids) == 10


def test_stop_string_cuts_text(make_engine, tiny_w4):
    engine = make_engine(tiny_w4)
    free_run = engine.generate(["The game"], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    text = free_run.text
    assert len(text) > 6
    stop = text[3:6]
    out = engine.generate(["The game"], SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == text[: text.index(stop)]
    assert free_run.token_ids[: len(out.token_ids)] == out.token_ids


def test_requests_that_cannot_fit_are_refused(make_engine, tiny_w4):
    engine = make_engine(tiny_w4, kv_budget=3 * TINY_PAGE_BYTES)  # 2 usable pages: 128 tokens
    with pytest.raises(ValueError, match="KV pages"):
        engine.add_request(PROMPTS[1], SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(1, 3)) * 600)
    assert engine.generate([PROMPTS[1]], SamplingParams(max_tokens=58, ignore_eos=True))[0].finish_reason == "length"
