import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("QOQ_DATA_DIR", REPO.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"offline data not found at {SHARED_DATA}: set QOQ_DATA_DIR to the shared data folder")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_tokenizer(shared_data):
    from eval.tiny_lm import train_tokenizer

    return train_tokenizer(shared_data)
