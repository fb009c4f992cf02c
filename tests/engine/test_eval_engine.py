"""`qoq eval --backend cuda`'s data flow on the CPU: WikiText-2 windows scored through the engine's CUDA
runner (ops="reference": every kernel swapped for its torch reference) with real KV4 pages and chunked
prefill, against the reference executor (`--backend reference`). The kernels path is in
test_engine_cuda.py (GPU)."""

import pytest
import torch

from qoq.engine.block_manager import pages_for
from qoq.eval.engine_forward import load_engine_for_eval
from qoq.eval.perplexity import wikitext2_perplexity, wikitext2_text
from qoq.eval.runner import _forward
from qoq.executor import load_artifact_model

SEQ_LEN, WINDOWS = 64, 4
CPU = dict(device="cpu", ops="reference", kv_budget=1 << 20)
# Engine (fp16 activations, fp16 lm_head) vs the executor (fp32), observed on these tiny artifacts over
# 4 windows of 64 tokens: perplexity rel 8.3e-4 (w4) / 1.1e-6 (fp16), worst window NLL rel 2.2e-4 / 1.3e-6,
# worst position's logits rel L2 7.7e-2 / 7.6e-4 (W4A8: an fp16 rounding that moves an INT8 activation code
# moves the output by a whole code step; test_runner_cuda_on_cpu allows 0.1 at one position). The tiny
# random models are near uniform (ppl ~400), which damps perplexity errors, hence the logits bound too.
PPL_TOL = {"w4": 5e-3, "fp16": 1e-4}
LOGITS_TOL = {"w4": 0.15, "fp16": 5e-3}
# one chunk vs chunks of 24 / 63 tokens, observed 8.1e-3 / 6.8e-3 (w4), 6.5e-4 / 7.3e-4 (fp16): the same
# K/V pages, but fp16 GEMMs over different row counts round differently
CHUNK_TOL = {"w4": 2e-2, "fp16": 3e-3}


@pytest.fixture(scope="module")
def stream(tiny_tokenizer, shared_data):
    """The protocol's token stream, first WINDOWS windows' worth (tokenizing the prefix keeps this fast)."""
    ids = tiny_tokenizer(wikitext2_text(shared_data)[:20_000], verbose=False)["input_ids"]
    assert len(ids) >= SEQ_LEN * WINDOWS
    return torch.tensor(ids[: SEQ_LEN * WINDOWS], dtype=torch.long)


@pytest.fixture
def artifacts(tiny_w4, tiny_fp16):
    return {"w4": tiny_w4, "fp16": tiny_fp16}


def _ppl(forward, tokenizer, ids):
    return wikitext2_perplexity(forward, tokenizer, ids=ids, seq_len=SEQ_LEN)


def _rel(a, b):
    """Largest per-position relative L2 difference of logits [T, V]."""
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()


def _assert_all_free(engine):
    assert engine.blocks.num_free_pages == engine.blocks.num_pages, "KV pages leaked"
    assert not engine.blocks.table._pages


@pytest.mark.parametrize("kind", ["w4", "fp16"])
def test_engine_perplexity_matches_the_executor(artifacts, kind, tiny_tokenizer, stream):
    art = artifacts[kind]
    executor = load_artifact_model(art)[0]
    want = _ppl(_forward(executor), tiny_tokenizer, stream)
    forward, engine = load_engine_for_eval(art, SEQ_LEN, prefill_chunk=SEQ_LEN, **CPU)
    assert engine.runner.kv4 == (kind == "w4")
    got = _ppl(forward, tiny_tokenizer, stream)
    _assert_all_free(engine)
    assert got["windows"] == want["windows"] == WINDOWS
    rel = abs(got["ppl"] - want["ppl"]) / want["ppl"]
    nll_rel = max(abs(g - w) / w for g, w in zip(got["nll_per_window"], want["nll_per_window"]))
    # the random tiny models are near uniform (ppl ~400), which hides logit errors: compare logits too
    window = stream[None, :SEQ_LEN]
    with torch.inference_mode():
        logits_rel = _rel(forward(window)[0], _forward(executor)(window)[0])
    print(f"{kind}: engine ppl {got['ppl']:.6f} executor {want['ppl']:.6f} rel {rel:.2e}, "
          f"window nll rel {nll_rel:.2e}, logits rel {logits_rel:.2e}")
    assert rel < PPL_TOL[kind] and nll_rel < PPL_TOL[kind]
    assert logits_rel < LOGITS_TOL[kind]
    _assert_all_free(engine)


@pytest.mark.parametrize("kind", ["w4", "fp16"])
@pytest.mark.parametrize("chunk", [24, 63])  # 24: chunks across a page boundary; 63: a 1-token tail (decode path)
def test_chunked_prefill_gives_the_same_logits(artifacts, kind, chunk, stream):
    forward, engine = load_engine_for_eval(artifacts[kind], SEQ_LEN, prefill_chunk=SEQ_LEN, **CPU)
    whole = forward(stream[None, :SEQ_LEN])
    forward.chunk_tokens = chunk
    chunked = forward(stream[None, :SEQ_LEN])
    _assert_all_free(engine)
    assert whole.shape == chunked.shape == (1, SEQ_LEN, engine.runner.vocab_size)
    rel = _rel(chunked[0], whole[0])
    print(f"{kind} chunk {chunk}: max per-position relative logits difference {rel:.2e}")
    assert rel < CHUNK_TOL[kind]


def test_all_logits_end_with_the_serving_paths_last_logits(tiny_w4, stream):
    from qoq.engine import SamplingParams

    forward, engine = load_engine_for_eval(tiny_w4, SEQ_LEN, **CPU)
    engine.record_logits = True
    prompt = stream[:40].tolist()
    served = engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0]
    scored = engine.prompt_logits(prompt)
    assert scored.shape == (40, engine.runner.vocab_size)
    last = served.logits[0].to(scored.device)
    print("last-row max abs diff", (scored[-1] - last).abs().max().item())
    # the same hidden state; only the lm_head GEMM over [40, H] vs [1, H] may round differently
    torch.testing.assert_close(scored[-1], last, rtol=1e-3, atol=1e-3)
    _assert_all_free(engine)


def test_default_kv_budget_holds_one_window(tiny_w4, tiny_fp16):
    for art in (tiny_w4, tiny_fp16):
        _, engine = load_engine_for_eval(art, SEQ_LEN * 3, device="cpu", ops="reference")
        assert engine.blocks.num_pages == pages_for(SEQ_LEN * 3)  # plus the scratch page
        assert engine.runner.graphs is None


def test_window_longer_than_the_model_is_refused(tiny_w4):
    with pytest.raises(ValueError, match="exceed the model's 1024 positions"):
        load_engine_for_eval(tiny_w4, 2048, **CPU)


def test_evaluate_task_cuda_backend_runs_the_engine(tiny_w4, shared_data):
    """`evaluate_task(backend="cuda")` (what `qoq eval --backend cuda` calls), on the CPU data flow."""
    from qoq.eval.runner import evaluate_task

    common = dict(windows=2, data_dir=shared_data, show_progress=False, seq_len=SEQ_LEN)
    got = evaluate_task("wikitext2", str(tiny_w4), backend="cuda", prefill_chunk=40,
                        engine_options=dict(device="cpu", ops="reference"), **common)
    want = evaluate_task("wikitext2", str(tiny_w4), backend="reference", **common)
    assert got["backend"] == "cuda" and got["engine"] == {"prefill_chunk": 40, "kv_pages": 1}
    assert got["recipe"] == want["recipe"] and got["seq_len"] == want["seq_len"] == SEQ_LEN
    assert "64-token windows" in got["protocol"]
    assert abs(got["ppl"] - want["ppl"]) / want["ppl"] < PPL_TOL["w4"]


def test_lm_eval_scoring_through_the_engine(tiny_w4, tiny_tokenizer, stream):
    """The lm-eval adapter takes the engine's callable as it takes the executor (loglikelihoods close)."""
    from qoq.eval.lm_eval_adapter import QoqLMScoring

    forward, engine = load_engine_for_eval(tiny_w4, SEQ_LEN, prefill_chunk=16, **CPU)
    ids = stream.tolist()
    requests = [(None, ids[:30], ids[30:34]), (None, ids[100:150], ids[150:170])]
    got = QoqLMScoring(forward, tiny_tokenizer, max_length=SEQ_LEN)._loglikelihood_tokens(requests)
    executor = _forward(load_artifact_model(tiny_w4)[0])
    want = QoqLMScoring(executor, tiny_tokenizer, max_length=SEQ_LEN)._loglikelihood_tokens(requests)
    for (g, _), (w, _) in zip(got, want):
        assert abs(g - w) / abs(w) < PPL_TOL["w4"]
    _assert_all_free(engine)
