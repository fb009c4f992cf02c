import json

import pytest
from tiny_lm import TinyCausalLM


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer):
    return tiny_tokenizer  # the session's one trained tokenizer (tests/conftest.py)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    return TinyCausalLM(len(tokenizer)).eval()


@pytest.fixture(scope="session")
def wikitext_text(shared_data) -> str:
    """The protocol's text, built here independently of qoq: test.jsonl rows joined with blank lines."""
    with (shared_data / "wikitext-2-raw" / "test.jsonl").open(encoding="utf-8") as f:
        return "\n\n".join(json.loads(line)["text"] for line in f)


@pytest.fixture(scope="session")
def wikitext_ids(tokenizer, wikitext_text) -> list[int]:
    return tokenizer(wikitext_text)["input_ids"]
