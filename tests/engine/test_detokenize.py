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


def _sentencepiece_like(data_dir):
    """A Llama-2-style tokenizer (Metaspace pieces, byte fallback, a decoder that strips the first space):
    not byte-level, so Detokenizer takes its decode-and-diff path."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")[:20_000]
    text = "".join(ch for ch in text if ch.isascii())  # everything else falls back to bytes
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    bpe.train_from_iterator(text.splitlines(), trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "</s>"]))
    model = json.loads(bpe.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def test_fallback_path_streams_exactly_the_whole_decode(shared_data):
    from qoq.engine.detokenize import _WINDOW

    tok = _sentencepiece_like(shared_data)
    text = (shared_data / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")[30_000:32_000]
    ids = tok(f"{TEXT} {text} {TEXT}")["input_ids"] + [tok.eos_token_id]
    assert not TokenBytes(tok).byte_level and len(ids) > 100 * _WINDOW
    d = Detokenizer(TokenBytes(tok))
    deltas, window = [], []
    for t in ids:
        deltas.append(d.push(t))
        window.append(len(d._ids) - d._start)
    deltas.append(d.flush())
    assert all("\ufffd" not in x for x in deltas)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    # each push decodes a window, not the whole output (over the ASCII middle: no character spans its start)
    assert max(window[100:-100]) < 2 * _WINDOW
