import pytest
import torch

from checkpoints import make_tiny_checkpoint
from qoq.executor import load_artifact_model
from qoq.models.config import ModelConfig
from qoq.models.llama import CausalLM
from qoq.passes import rotation  # noqa: F401  (registers "rotation")
from qoq.passes.base import BlockContext, ModelContext
from qoq.passes.capture import capture_inputs
from qoq.passes.pipeline import quantize_model
from qoq.passes.rotation import Rotation, RotationOptions
from qoq.quant.activations import fake_quant_tokens
from qoq.recipe import parse_recipe

FLOAT = {"format": {"weight_bits": 16, "group_size": -1, "act_bits": 16, "kv_bits": 16}}
QKV, GATE_UP = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _tiny_lm(hidden, heads, kv_heads, model_type="llama", tied=False, seed=0, **extra) -> CausalLM:
    """Random weights everywhere, including norm γ and biases, so folding and bias rotation matter."""
    cfg = ModelConfig.from_hf({
        "model_type": model_type, "vocab_size": 96, "hidden_size": hidden, "intermediate_size": 192,
        "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
        "tie_word_embeddings": tied, **extra})
    torch.manual_seed(seed)
    lm = CausalLM(cfg)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 2.0)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return lm.eval()


def _rotate(lm: CausalLM, ids: torch.Tensor, options=None) -> dict:
    """The pass as the pipeline runs it: prepare the skeleton, then each loaded block with its inputs."""
    recipe = parse_recipe({"passes": ["rotation"], **FLOAT}, "rotation-only", "test")
    rot = Rotation(options)
    record = rot.prepare_model(lm, ModelContext(lm.config, recipe, seed=0))
    positions = lm.position_ids(ids.shape[1])
    with torch.no_grad():
        h = lm.embed(ids)  # [B, T, H], already in the rotated basis
        for i, block in enumerate(lm.model.layers):
            assert rot.apply(block, BlockContext(i, lm.config, recipe, h, positions)) == {}
            h = block(h, positions)
    return record


CONFIGS = {  # name -> (_tiny_lm args, expected residual kind, expected head kind)
    "gqa": (dict(hidden=128, heads=4, kv_heads=2), "hadamard-sylvester(128)", "hadamard-sylvester(32)"),
    "qwen2-bias": (dict(hidden=96, heads=3, kv_heads=1, model_type="qwen2"),
                   "hadamard-paley1(12)xsylvester(8)", "hadamard-sylvester(32)"),
    "llama-o-bias-tied": (dict(hidden=128, heads=4, kv_heads=4, tied=True, attention_bias=True),
                          "hadamard-sylvester(128)", "hadamard-sylvester(32)"),
    "576": (dict(hidden=576, heads=9, kv_heads=3), "hadamard-table(36)xsylvester(16)", "hadamard-sylvester(64)"),
    "640": (dict(hidden=640, heads=10, kv_heads=2), "hadamard-paley1(20)xsylvester(32)", "hadamard-sylvester(64)"),
    "head-80": (dict(hidden=160, heads=2, kv_heads=1), "hadamard-paley1(20)xsylvester(8)",
                "hadamard-paley1(20)xsylvester(4)"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_rotation_keeps_fp32_logits(name):
    args, residual_kind, head_kind = CONFIGS[name]
    lm = _tiny_lm(**args)
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = lm(ids)
    embed_before = lm.model.embed_tokens.weight.detach().clone()
    record = _rotate(lm, ids)
    with torch.no_grad():
        after = lm(ids)
    assert _rel(after, before) < 1e-4
    hidden, head_dim = lm.config.hidden_size, lm.config.head_dim
    assert record == {"residual": {"kind": residual_kind, "size": hidden},
                      "head": {"kind": head_kind, "size": head_dim}}
    assert _rel(lm.model.embed_tokens.weight, embed_before) > 0.5  # really rotated, not left alone
    assert not lm.config.tie_word_embeddings and lm.lm_head.weight is not lm.model.embed_tokens.weight
    norms = [lm.model.norm] + [getattr(b, n) for b in lm.model.layers
                                for n in ("input_layernorm", "post_attention_layernorm")]
    assert all(torch.equal(n.weight, torch.ones_like(n.weight)) for n in norms)


def test_rotation_without_head_hadamard_and_with_random_fallback():
    lm = _tiny_lm(hidden=184, heads=2, kv_heads=1)  # 184 = 8·23 and head_dim 92: no Hadamard construction
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = lm(ids)
    with pytest.warns(UserWarning, match="size 184"):
        record = _rotate(lm, ids, RotationOptions(seed=5, per_head_v=False))
    with torch.no_grad():
        assert _rel(lm(ids), before) < 1e-4
    assert record == {"residual": {"kind": "random-orthogonal(seed=5)", "size": 184}, "head": None}


def test_apply_before_prepare_is_refused():
    lm = _tiny_lm(hidden=64, heads=2, kv_heads=1)
    recipe = parse_recipe({"passes": ["rotation"], **FLOAT}, "r", "test")
    ctx = BlockContext(0, lm.config, recipe, torch.zeros(1, 4, 64), torch.arange(4))
    with pytest.raises(RuntimeError, match="before rotation.prepare_model"):
        Rotation().apply(lm.model.layers[0], ctx)


def _a8_errors(lm: CausalLM, ids: torch.Tensor) -> dict[str, float]:
    """Relative per-token INT8 error of what q/k/v and gate/up read, over all blocks."""
    positions, err = lm.position_ids(ids.shape[1]), {"qkv": [], "gate_up": []}
    with torch.no_grad():
        h = lm.embed(ids)
        for block in lm.model.layers:
            seen = capture_inputs(block, h, positions, [QKV[0], GATE_UP[0]])  # q/k/v (gate/up) share inputs
            for key, name in (("qkv", QKV[0]), ("gate_up", GATE_UP[0])):
                err[key].append(_rel(fake_quant_tokens(seen[name]), seen[name]))
            h = block(h, positions)
    return {k: max(v) for k, v in err.items()}


def test_rotation_lowers_a8_error_on_outlier_channels():
    lm = _tiny_lm(hidden=256, heads=4, kv_heads=2, seed=3)
    with torch.no_grad():  # residual outlier channels (embeddings) and norm-gain outliers
        lm.model.embed_tokens.weight[:, [7, 100, 201]] *= 50.0
        for block in lm.model.layers:
            block.input_layernorm.weight[[30, 160]] *= 50.0
            block.post_attention_layernorm.weight[[55, 222]] *= 50.0
    ids = torch.randint(0, 96, (4, 32), generator=torch.Generator().manual_seed(4))
    before = _a8_errors(lm, ids)
    _rotate(lm, ids)
    after = _a8_errors(lm, ids)
    for key in before:
        assert after[key] < before[key] / 4, (key, before[key], after[key])


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory, tiny_tokenizer):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tied"), tiny_tokenizer, arch="qwen2", tied=True)


def test_pipeline_rotation_survives_export(tmp_path, tied_dir, shared_data):
    raw = {"passes": ["rotation", "rtn"], "format": {"group_size": 128},
           "calibration": {"samples": 4, "seq_len": 64}}
    recipe = parse_recipe(raw, "rotation-rtn", "test")
    result = quantize_model(str(tied_dir), recipe, tmp_path / "art", data_dir=shared_data, keep_model=True,
                            show_progress=False)
    executed, art = load_artifact_model(tmp_path / "art")
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        assert _rel(executed(ids), result.model(ids)) < 1e-4
    assert art.config["tie_word_embeddings"] is False and "lm_head.weight" in art.tensors
    assert art.manifest["passes"]["model"]["rotation"] == {
        "residual": {"kind": "hadamard-sylvester(128)", "size": 128},
        "head": {"kind": "hadamard-sylvester(32)", "size": 32}}
    assert torch.equal(art.tensors["model.norm.weight"], torch.ones(128, dtype=torch.float16))


def test_pipeline_rotation_alone_matches_the_float_model(tmp_path, tied_dir, shared_data):
    from qoq.models.loader import load_model

    recipe = parse_recipe({"passes": ["rotation"], **FLOAT, "calibration": {"samples": 2, "seq_len": 32}},
                          "rotation-fp16", "test")
    quantize_model(str(tied_dir), recipe, tmp_path / "art", data_dir=shared_data, show_progress=False)
    executed, _ = load_artifact_model(tmp_path / "art")
    float_lm, _ = load_model(tied_dir)
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        assert _rel(executed(ids), float_lm(ids)) < 5e-3  # fp16 storage of rotated weights only


def test_online_down_rotation_keeps_fp32_logits():
    """format.online_hadamard (QuaRot): W_down ← W_down·R_K and down_proj's input rotated at run time by the
    same R_K (intermediate 192 = Paley I 12 x Sylvester 16): the float model computes what it did."""
    from qoq.quant.hadamard import OnlineRotation

    lm = _tiny_lm(hidden=128, heads=4, kv_heads=2)
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = lm(ids)
    fmt = {"weight_bits": 4, "group_size": -1, "act_bits": 4, "kv_bits": 4, "weight_scheme": "symmetric",
           "online_hadamard": True}
    recipe = parse_recipe({"passes": ["rotation", "rtn"], "format": fmt}, "quarot-like", "test")
    rot = Rotation()
    rot.prepare_model(lm, ModelContext(lm.config, recipe, seed=0))
    positions = lm.position_ids(ids.shape[1])
    with torch.no_grad():
        h = lm.embed(ids)
        for i, block in enumerate(lm.model.layers):
            record = rot.apply(block, BlockContext(i, lm.config, recipe, h, positions))
            assert record == {"online_down": "hadamard-paley1(12)xsylvester(16)"}
            assert isinstance(block.mlp.down_input_transform, OnlineRotation)
            h = block(h, positions)
        assert _rel(lm(ids), before) < 1e-4
