import json
import sys

import pytest
import torch

from qoq.calibration import (
    DATA_DIR_ENV,
    DataSpec,
    available_specs,
    calibration_tokens,
    data_dir,
    describe,
    load_spec,
    load_texts,
)
from tests.eval.tiny_lm import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    return train_tokenizer(shared_data)


def test_repo_specs_load():
    assert {"pile-val", "wikitext2", "wikitext2-test"} <= set(available_specs())
    pile = load_spec("pile-val")
    assert (pile.hf_dataset, pile.hf_split, pile.local_file) == (
        "mit-han-lab/pile-val-backup",
        "validation",
        "calib/groups_merged.txt",
    )
    test = load_spec("wikitext2-test")
    assert (test.hf_dataset, test.hf_config, test.hf_split) == ("wikitext", "wikitext-2-raw-v1", "test")


def test_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert data_dir() is None
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "env"))
    assert data_dir() == tmp_path / "env"
    assert data_dir(tmp_path / "flag") == tmp_path / "flag"


def test_txt_splits_paragraphs(shared_data):
    texts = load_texts(load_spec("pile-val"), shared_data)
    assert len(texts) == 1004
    assert texts[0].startswith("In addition to a significant decrease in hepatic lipid")
    assert all(t.strip() == t and "\n\n" not in t for t in texts)


def test_jsonl_keeps_rows(shared_data):
    rows = load_texts(load_spec("wikitext2-test"), shared_data)
    assert len(rows) == 4358
    assert rows[:2] == ["", " = Robert Boulter = \n"]


def test_tokens_deterministic_and_follow_the_rule(shared_data, tokenizer):
    spec = load_spec("wikitext2")
    a = calibration_tokens(spec, tokenizer, shared_data, samples=4, seq_len=64, seed=0)
    b = calibration_tokens(spec, tokenizer, shared_data, samples=4, seq_len=64, seed=0)
    c = calibration_tokens(spec, tokenizer, shared_data, samples=4, seq_len=64, seed=1)
    assert a.shape == (4, 64) and a.dtype == torch.long
    assert torch.equal(a, b) and not torch.equal(a, c)
    # the documented rule, recomputed: first documents up to 16 chars per needed token, randint starts
    texts, taken = load_texts(spec, shared_data), []
    while sum(map(len, taken)) < 16 * 4 * 64:
        taken.append(texts[len(taken)])
    ids = tokenizer("\n\n".join(taken), add_special_tokens=False)["input_ids"]
    starts = torch.randint(0, len(ids) - 63, (4,), generator=torch.Generator().manual_seed(1)).tolist()
    assert c.tolist() == [ids[s : s + 64] for s in starts]


def test_document_sampling_follows_its_rule(shared_data, tokenizer):
    """'documents': one window per shuffled document, concatenated and cut into rows; deterministic."""
    spec = load_spec("pile-val")
    a = calibration_tokens(spec, tokenizer, shared_data, samples=4, seq_len=64, seed=3, sampling="documents")
    assert torch.equal(a, calibration_tokens(spec, tokenizer, shared_data, samples=4, seq_len=64, seed=3,
                                             sampling="documents"))
    assert a.shape == (4, 64) and a.dtype == torch.long
    docs = [t for t in load_texts(spec, shared_data) if t.strip()]
    g = torch.Generator().manual_seed(3)
    pieces = []
    for i in torch.randperm(len(docs), generator=g).tolist():
        ids = tokenizer(docs[i], add_special_tokens=False)["input_ids"]
        if len(ids) > 64:
            start = int(torch.randint(0, len(ids) - 63, (1,), generator=g))
            ids = ids[start : start + 64]
        pieces += ids
        if len(pieces) >= 256:
            break
    assert a.flatten().tolist() == pieces[:256]
    assert not torch.equal(a, calibration_tokens(spec, tokenizer, shared_data, samples=4, seq_len=64, seed=3))
    with pytest.raises(ValueError, match="sampling must be"):
        calibration_tokens(spec, tokenizer, shared_data, samples=4, seq_len=64, seed=3, sampling="random")


def test_describe(shared_data, tokenizer):
    spec = load_spec("pile-val")
    tokens = calibration_tokens(spec, tokenizer, shared_data, samples=2, seq_len=32)
    info = describe(spec, tokens, shared_data)
    assert info["source"] == str(shared_data / "calib" / "groups_merged.txt")
    assert (info["samples"], info["seq_len"], info["seed"]) == (2, 32, 0)
    assert info == describe(spec, tokens.clone(), shared_data)
    assert info["sha256"] != describe(spec, tokens + 1, shared_data)["sha256"]


def test_adhoc_files(tmp_path, tokenizer):
    rows = [{"text": f"document number {i} says hello"} for i in range(5)]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = load_spec(jsonl)
    assert (spec.name, spec.local_file) == ("docs", str(jsonl))
    assert load_texts(spec) == [r["text"] for r in rows]
    assert calibration_tokens(spec, tokenizer, samples=3, seq_len=8).shape == (3, 8)
    with pytest.raises(ValueError, match="fewer than seq_len=4096"):
        calibration_tokens(spec, tokenizer, samples=1, seq_len=4096)
    jsonl.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(ValueError, match=r"docs.jsonl:2: row has no text field 'text'"):
        load_texts(spec)
    jsonl.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"docs.jsonl:2: not a JSON row"):
        load_texts(spec)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"content": ["alpha beta", "", "gamma"]}), path)
    spec = DataSpec(name="rows", local_file=str(path), text_field="content")
    assert load_texts(spec) == ["alpha beta", "", "gamma"]
    with pytest.raises(ValueError, match="no column 'text'"):
        load_texts(load_spec(path))


@pytest.mark.parametrize(
    "body, message",
    [
        ('name = "x"\nlocal_file = "a.txt"\nsampels = 3\n', "unknown key 'sampels'"),
        ('name = "x"\nlocal_file = "a.txt"\nsamples = "128"\n', "key 'samples' must be int, got str"),
        ('name = "x"\nlocal_file = "a.txt"\nseed = true\n', "key 'seed' must be int, got bool"),
        ('name = "x"\nlocal_file = "a.txt"\nseq_len = 0\n', "key 'seq_len' must be >= 1"),
        ('name = "x"\n', "needs a source"),
        ('local_file = "a.txt"\n', "missing required key 'name'"),
    ],
)
def test_strict_schema(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ValueError, match=message) as error:
        load_spec(path)
    assert str(path) in str(error.value)


def test_unknown_spec_name_lists_known():
    with pytest.raises(FileNotFoundError, match="unknown data spec 'nope'.*pile-val"):
        load_spec("nope")


def test_missing_local_file_fails_at_once_and_never_reaches_the_hub(monkeypatch, tmp_path):
    """A data dir that lacks the spec's file is an error naming the path, not a switch to the network."""
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # any attempt to use the hub -> ImportError
    with pytest.raises(FileNotFoundError) as error:
        load_texts(load_spec("pile-val"), tmp_path)
    assert str(tmp_path / "calib" / "groups_merged.txt") in str(error.value)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "wrong"))
    with pytest.raises(FileNotFoundError, match="wrong.*is not a directory"):
        load_texts(load_spec("pile-val"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_texts(DataSpec(name="x", local_file="missing.txt"), tmp_path)


def test_hub_only_without_a_data_dir(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError) as error:
        load_texts(load_spec("pile-val"))
    for part in ("calib/groups_merged.txt", DATA_DIR_ENV, "datasets"):
        assert part in str(error.value)
    with pytest.raises(FileNotFoundError, match="needs a data dir"):
        load_texts(DataSpec(name="x", local_file="missing.txt"))
