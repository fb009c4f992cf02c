"""Incremental detokenization: multi-byte characters split over byte-level tokens are never emitted
broken; stop strings are held back, then cut."""

from qoq.engine.detokenize import Detokenizer, TokenBytes

TEXT = "Café 日本語 naïve 🙂 done — ok"


def stream(tokenizer, ids, stop=()):
    d = Detokenizer(TokenBytes(tokenizer), stop)
    deltas = [d.push(t) for t in ids]
    deltas.append(d.flush())
    return deltas, d


def test_multibyte_characters_never_break(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT)["input_ids"]
    tb = TokenBytes(tiny_tokenizer)
    assert tb.byte_level
    # the tiny vocabulary has no merges for these characters: some tokens are partial UTF-8 sequences
    assert any(_partial(tb(t)) for t in ids)
    deltas, _ = stream(tiny_tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT == tiny_tokenizer.decode(ids)


def _partial(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_special_tokens_give_no_text(tiny_tokenizer):
    ids = tiny_tokenizer("ab")["input_ids"] + [tiny_tokenizer.eos_token_id]
    deltas, _ = stream(tiny_tokenizer, ids)
    assert "".join(deltas) == "ab"


def test_stop_string_held_back_then_cut(tiny_tokenizer):
    ids = tiny_tokenizer("hello world, stop here")["input_ids"]
    deltas, d = stream(tiny_tokenizer, ids, stop=["o w", ", st"])
    assert d.stopped and d.text == "hell" and "".join(deltas) == "hell"


def test_partial_stop_prefix_is_released_at_the_end(tiny_tokenizer):
    ids = tiny_tokenizer("the end:")["input_ids"]
    d = Detokenizer(TokenBytes(tiny_tokenizer), [":END"])
    emitted = "".join(d.push(t) for t in ids)
    assert emitted == "the end"  # ':' could start the stop string
    assert d.flush() == ":" and not d.stopped
