"""Server test fixtures: a tiny random W4A8KV4 artifact whose tokenizer has a chat template, and `qoq serve`
running on it as a real subprocess on a free 127.0.0.1 port (always terminated by the fixture)."""

import copy
import dataclasses
import importlib.util

import pytest

from checkpoints import make_tiny_checkpoint
from serve_support import API_KEY, CHAT_TEMPLATE, KV_PAGES, MODEL, PAGE_BYTES, Server

if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
    collect_ignore_glob = ["test_*.py"]  # the serve extra is not installed


@pytest.fixture(scope="session")
def chat_artifact(tmp_path_factory, tiny_tokenizer, shared_data):
    from qoq.passes.pipeline import quantize_model
    from qoq.recipe import Calibration, load_recipe

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = CHAT_TEMPLATE
    ckpt = make_tiny_checkpoint(tmp_path_factory.mktemp("serve_ckpt"), tok, hidden=128, heads=4, kv_heads=2,
                                layers=2, intermediate=256)
    recipe = dataclasses.replace(load_recipe("w4a8kv4g64-rtn"), calibration=Calibration(samples=4, seq_len=128))
    out = tmp_path_factory.mktemp("serve_art") / "w4"
    quantize_model(str(ckpt), recipe, out, data_dir=shared_data, show_progress=False)
    return out


@pytest.fixture(scope="session")
def reference_engine(chat_artifact):
    """The engine in this process: what the server must answer, token for token (greedy)."""
    from qoq.engine import LLMEngine

    return LLMEngine(chat_artifact, backend="reference")


@pytest.fixture(scope="session")
def server(chat_artifact, tmp_path_factory):
    """The shared server: API key on, a KV budget smaller than the context, 8 sequences at most."""
    srv = Server(chat_artifact, tmp_path_factory.mktemp("serve_log") / "server.log", "--api-key", API_KEY,
                 "--served-model-name", MODEL, "--kv-budget", str(KV_PAGES * PAGE_BYTES), "--max-num-seqs", "8")
    yield srv
    srv.stop()
