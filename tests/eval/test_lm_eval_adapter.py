import json
import sys
from pathlib import Path

import pytest
import torch

from qoq.eval.lm_eval_adapter import QoqLMScoring, run_lm_eval

pytest.importorskip("lm_eval")
REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tests" / "data"


def evaluate(model, tokenizer, tasks, max_length):
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # the task YAMLs name their jsonl files relative to the repo root
        return run_lm_eval(
            model, tokenizer, tasks, include_path=str(TASKS), include_defaults=False,
            max_length=max_length, log_samples=True,
        )


@pytest.fixture(scope="module")
def results(tiny_model, tokenizer):
    return evaluate(tiny_model, tokenizer, ["qoq_tiny_mc", "qoq_tiny_gen"], max_length=2048)


def direct_loglikelihood(model, tokenizer, context, continuation):
    """log p(continuation | context) straight from the model's logits, one forward pass."""
    context_ids = tokenizer.encode(context)
    whole = tokenizer.encode(context + continuation)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([whole[:-1]]))[0].float(), dim=-1)  # [T-1, V]
    targets = torch.tensor(whole[len(context_ids) :])  # [C]
    scored = logprobs[len(context_ids) - 1 :]  # [C, V]: position t predicts token t + 1
    return scored.gather(-1, targets[:, None]).sum().item(), bool((scored.argmax(-1) == targets).all())


def test_multiple_choice_matches_direct(results, tiny_model, tokenizer):
    samples = results["samples"]["qoq_tiny_mc"]
    rows = [json.loads(line) for line in (TASKS / "qoq_tiny_mc.jsonl").read_text().splitlines()]
    assert len(samples) == len(rows) == 6
    correct = []
    for sample, row in zip(samples, rows):
        assert [a[1] for a in sample["arguments"]] == [" " + c for c in row["choices"]]
        direct = [direct_loglikelihood(tiny_model, tokenizer, *a) for a in sample["arguments"]]
        for (logprob, greedy), (ours, our_greedy) in zip(direct, sample["filtered_resps"]):
            assert abs(logprob - ours) < 1e-5 and greedy == our_greedy
        correct.append(max(range(len(direct)), key=lambda i: direct[i][0]) == row["answer"])
    accuracy = results["results"]["qoq_tiny_mc"]["acc,none"]
    assert 0.0 <= accuracy <= 1.0
    assert accuracy == pytest.approx(sum(correct) / len(correct), abs=1e-12)


def test_generate_until_is_greedy_and_stops(results, tiny_model, tokenizer):
    samples = results["samples"]["qoq_tiny_gen"]
    assert len(samples) == 5
    for sample in samples:
        context, gen_kwargs = sample["arguments"][0]
        ids = tokenizer.encode(context)
        generated = []
        for _ in range(gen_kwargs["max_gen_toks"]):
            with torch.no_grad():
                token = int(tiny_model(torch.tensor([ids + generated]))[0, -1].argmax())
            if token == tokenizer.eos_token_id or "\n" in tokenizer.decode(generated):
                break
            generated.append(token)
        expected = tokenizer.decode(generated).split("\n")[0]
        assert sample["filtered_resps"][0] == expected
    assert results["results"]["qoq_tiny_gen"]["exact_match,none"] in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def test_rolling_windows_match_direct(tiny_model, tokenizer):
    max_length = 8  # several windows per document, the last one partial
    rolled = evaluate(tiny_model, tokenizer, ["qoq_tiny_rolling"], max_length=max_length)
    samples = rolled["samples"]["qoq_tiny_rolling"]
    for sample in samples:
        (text,) = sample["arguments"][0]
        tokens = tokenizer.encode(text)
        sequence = [tokenizer.bos_token_id] + tokens  # sequence[j + 1] = tokens[j]
        total = 0.0
        for start in range(0, len(tokens), max_length):
            end = min(start + max_length, len(tokens))
            inputs = sequence[max(0, end - max_length) : end]  # the max_length tokens before `end`
            with torch.no_grad():
                logprobs = torch.log_softmax(tiny_model(torch.tensor([inputs]))[0], dim=-1)  # [L, V]
            targets = torch.tensor(tokens[start:end])
            total += logprobs[-len(targets) :].gather(-1, targets[:, None]).sum().item()
        assert len(tokens) > 2 * max_length
        assert abs(sample["filtered_resps"][0] - total) < 1e-5


def test_greedy_only(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="greedily only"):
        QoqLMScoring(tiny_model, tokenizer).greedy_generate("Q:", {"do_sample": True})


def test_missing_lm_eval_is_a_clear_error(monkeypatch, tiny_model, tokenizer):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'qoq\[eval\]'"):
        run_lm_eval(tiny_model, tokenizer, ["qoq_tiny_mc"])
