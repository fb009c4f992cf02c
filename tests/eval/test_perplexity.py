import math

import pytest
import torch
import torch.nn.functional as F
from tokenizers import processors

from qoq.eval.perplexity import (
    wikitext2_perplexity,
    wikitext2_text,
    wikitext2_token_ids,
    window_plan,
)


def test_joined_text_is_the_protocols(shared_data, wikitext_text):
    text = wikitext2_text(shared_data)
    assert len(text) == 1_294_336
    assert text.startswith("\n\n = Robert Boulter = \n\n\n\n\n Robert Boulter is")
    assert text == wikitext_text


def test_window_plan_counts():
    # SmolLM2-135M's token count from ../shared/data/README.md
    assert window_plan(304_986) == {
        "windows": 148,
        "total_windows": 148,
        "tokens": 303_104,
        "total_tokens": 304_986,
        "seq_len": 2048,
    }
    assert window_plan(304_986, windows=40)["tokens"] == 81_920
    assert window_plan(4096, seq_len=2048)["total_windows"] == 2
    assert window_plan(4095, seq_len=2048)["total_windows"] == 1
    with pytest.raises(ValueError, match="fewer than one window"):
        window_plan(2047)
    with pytest.raises(ValueError, match=r"windows must be in \[1, 148\]"):
        window_plan(304_986, windows=149)


def test_matches_direct_cross_entropy(shared_data, tokenizer, tiny_model, wikitext_ids):
    seen = []
    result = wikitext2_perplexity(
        tiny_model, tokenizer, shared_data, windows=3, progress=lambda *a: seen.append(a)
    )
    ids = torch.tensor(wikitext_ids)  # [N]
    direct = []
    with torch.no_grad():
        for i in range(3):
            window = ids[i * 2048 : (i + 1) * 2048]  # [2048]
            logits = tiny_model(window[None])[0]  # [2048, V]
            direct.append(F.cross_entropy(logits[:-1], window[1:]).item())
    ppl = math.exp(sum(direct) / 3)
    assert abs(result["ppl"] - ppl) / ppl < 1e-6
    assert result["nll_per_window"] == pytest.approx(direct, rel=1e-6)
    assert (result["windows"], result["tokens"], result["seq_len"]) == (3, 6144, 2048)
    assert (result["total_tokens"], result["total_windows"]) == (len(ids), len(ids) // 2048)
    assert result["task"] == "wikitext2" and "2048-token windows" in result["protocol"]
    assert [s[:2] for s in seen] == [(1, 3), (2, 3), (3, 3)]
    assert seen[-1][2] == pytest.approx(result["ppl"], rel=1e-12)
    assert seen[0][2] == pytest.approx(math.exp(direct[0]), rel=1e-6)


def test_tokenizer_defaults_are_used(shared_data, tokenizer, wikitext_ids):
    # a tokenizer whose defaults add BOS: the count (and every window) includes it
    with_bos = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|endoftext|>")
    bos_id = with_bos.eos_token_id
    with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos_id)]
    )
    assert tokenizer("a")["input_ids"] != with_bos("a")["input_ids"]  # the fixture is untouched
    ids = wikitext2_token_ids(with_bos, shared_data)
    assert ids[0] == bos_id and ids[1:].tolist() == wikitext_ids
    ids = wikitext2_token_ids(tokenizer, shared_data)
    assert window_plan(ids.numel(), seq_len=1000)["total_windows"] == len(wikitext_ids) // 1000
