"""Our artifacts load in SGLang's `qoq` quantization method (sglang 0.5.15.post1, read from its wheel by
sglang_source.py): its QoQConfig accepts config.json's quantization_config, SGLang's own linear layers and
load_weights take every tensor by name, shape and dtype, and the fused parameters they fill compute what
the artifact's projections compute. Also pinned: what SGLang does not take (group 64, a 4-bit KV cache,
tensor parallelism of the row-parallel layers), as docs/serve.md states it."""

import logging

import pytest
import torch
from checkpoints import make_tiny_checkpoint

from qoq.export.artifact import artifact_config, read_artifact
from qoq.export.packing import deinterleave_s2, unpack_qweight
from qoq.quant.linear import IntegerLinear
from tests.export.sglang_source import SGLangCode, unavailable

FUSED = {"self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
         "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
         "self_attn.o_proj": ["self_attn.o_proj"], "mlp.down_proj": ["mlp.down_proj"]}
# hidden 256, heads 4 of 64, 2 KV heads, intermediate 512: at TP=2 every shard keeps N % 32 == 0 and the
# row-parallel K (128, 256) a multiple of group 128
TP_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 128, "rope_theta": 1e4}


@pytest.fixture(scope="session")  # session: set up (or skipped) before the session fixtures artifacts need
def sglang():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    return SGLangCode()


def _recipe(name: str, passes: tuple | None):
    """The recipe with 4 calibration samples; `passes`: only these (the searches of smooth_down, clip and
    gptq change values, not what the artifact holds)."""
    import dataclasses

    from tests.engine.engine_support import small

    recipe = small(name)
    if passes is None:
        return recipe
    rtn = small("w4a8kv4g128-rtn")
    return dataclasses.replace(recipe, passes=passes, pass_options={**recipe.pass_options, **rtn.pass_options})


def _artifact(tmp_path_factory, tokenizer, data, arch, recipe, passes, tied):
    from qoq.passes.pipeline import quantize_model

    root = tmp_path_factory.mktemp(f"sglang_{arch}")
    ckpt = make_tiny_checkpoint(root / "ckpt", tokenizer, arch=arch, hidden=128, heads=4, kv_heads=2, layers=2,
                                intermediate=256, tied=tied, perturb=True)
    quantize_model(str(ckpt), _recipe(recipe, passes), root / "art", data_dir=data, show_progress=False)
    return read_artifact(root / "art")


# Qwen2 (q/k/v biases) in g128 with the passes that change what is stored (rotation unties the embeddings,
# rotates biases; reorder, smooth_attention); a tied Llama per channel
CASES = {"qwen2-g128": ("qwen2", "w4a8kv4g128", ("rotation", "reorder", "smooth_attention", "rtn"), False),
         "llama-per-channel": ("llama", "w4a8kv4-rtn", None, True)}


@pytest.fixture(scope="module", params=list(CASES))
def artifact(request, sglang, tmp_path_factory, tiny_tokenizer, shared_data):
    return _artifact(tmp_path_factory, tiny_tokenizer, shared_data, *CASES[request.param])


def _recording_loaders(skeleton, default_loader, calls: list):
    """Record (parameter, its dtype, the tensor's dtype) for every tensor a loader receives; the loaders still
    load (and assert the shape)."""
    for name, param in skeleton.named_parameters():
        real = getattr(param, "weight_loader", None) or default_loader

        def record(p, loaded, *shard, _real=real, _name=name):
            calls.append((_name, p.dtype, loaded.dtype))
            return _real(p, loaded, *shard)

        if hasattr(param, "_weight_loader"):
            param._weight_loader = record  # BasevLLMParameter's weight_loader property returns it
        else:
            param.weight_loader = record


def _load(sglang, art, fill, tp_rank=0, tp_size=1):
    skeleton = sglang.model_skeleton(art.config, tp_rank, tp_size)
    for p in skeleton.parameters():
        p.data.fill_(fill)
    calls: list = []
    _recording_loaders(skeleton, sglang.default_weight_loader, calls)
    sglang.load(skeleton, art.tensors)
    return skeleton, calls


def _sglang_linear(module) -> IntegerLinear:
    """The artifact format read back from the parameters SGLang's layer holds after loading."""
    return IntegerLinear.from_tensors({f"x.{n}": p.data for n, p in module.named_parameters()}, "x")


def test_config_is_accepted_as_is(artifact, sglang):
    qc = artifact.config["quantization_config"]
    assert "qoq" in sglang.quantization_methods()  # config.json's quant_method selects it
    quant = sglang.QoQConfig.from_config(qc)
    # abits, kv_bits, recipe, producer: not read, not kept
    assert vars(quant) == {"weight_bits": 4, "group_size": qc["group_size"], "pack_factor": 2}
    import transformers

    # SGLang takes the model dtype from transformers' config.dtype; QoQ runs fp16 activations only
    dtype = transformers.AutoConfig.from_pretrained(artifact.path).dtype
    assert dtype == torch.float16 and sglang.QoQConfig.get_supported_act_dtypes() == [torch.float16]


def test_every_tensor_loads_by_name_shape_and_dtype(artifact, sglang, caplog):
    with caplog.at_level(logging.WARNING, logger=sglang.load_log.name):
        zeros, calls = _load(sglang, artifact, 0)
        minus_ones, _ = _load(sglang, artifact, -1)
    assert not caplog.records, caplog.records[0].getMessage()  # "Parameter ... not found in params_dict"
    assert len(calls) == len(artifact.tensors)  # none skipped by name, none loaded twice
    casts = [c for c in calls if c[1] != c[2]]
    assert not casts, f"{casts[0][0]} is {casts[0][1]}, the artifact gives {casts[0][2]}"
    unwritten = [n for (n, a), b in zip(zeros.named_parameters(), minus_ones.parameters()) if not torch.equal(a, b)]
    assert not unwritten, f"{unwritten[0]}: elements no tensor was loaded into"
    layer_tensors = {n.split(".")[-1] for n in artifact.tensors if ".layers.0.self_attn.q_proj." in n}
    per_channel = artifact.config["quantization_config"]["group_size"] == -1
    assert layer_tensors >= ({"qweight", "s1_scales", "s1_szeros"} if per_channel else
                             {"qweight", "s1_scales", "s2_scales", "s2_zeros"})


def test_fused_parameters_compute_the_artifact_projections(artifact, sglang):
    skeleton, _ = _load(sglang, artifact, 0)
    x = torch.randn(3, artifact.config["intermediate_size"], generator=torch.Generator().manual_seed(0)).half()
    for i, layer in enumerate(skeleton.model.layers):
        for fused, parts in FUSED.items():
            got = _sglang_linear(layer.get_submodule(fused))
            xk = x[:, :got.weight.shape[1]]
            want = [IntegerLinear.from_tensors(artifact.tensors, f"model.layers.{i}.{p}")(xk) for p in parts]
            assert torch.equal(got(xk), torch.cat(want, -1)), f"layer {i} {fused}"
            if fused == "self_attn.qkv_proj" and artifact.config["architectures"] == ["Qwen2ForCausalLM"]:
                assert got.bias is not None and got.bias.abs().sum() > 0


def test_group_64_and_kv4_are_not_sglang_formats(sglang):
    from qoq.recipe import load_recipe

    assert sglang.supported_group_sizes == [-1, 128]
    qc = artifact_config({}, load_recipe("w4a8kv4g64"))["quantization_config"]
    with pytest.raises(ValueError, match="group_size = 64"):
        sglang.QoQConfig.from_config(qc)
    # no 4-bit integer KV cache: "auto" is the model dtype (fp16 for these artifacts)
    assert sglang.kv_cache_dtypes() == ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]


@pytest.fixture(scope="module")
def tp_artifact(sglang, tmp_path_factory):
    from qoq.export.random_artifact import write_random_artifact

    return read_artifact(write_random_artifact(tmp_path_factory.mktemp("sglang_tp") / "art", TP_SHAPE,
                                               "w4a8kv4g128", tokenizer=None))


def test_tp2_column_shards_are_exact_row_shards_are_not(tp_artifact, sglang):
    art, t = tp_artifact, tp_artifact.tensors
    x = torch.randn(3, TP_SHAPE["hidden_size"], generator=torch.Generator().manual_seed(0)).half()
    for rank in (0, 1):
        layer = _load(sglang, art, 0, rank, 2)[0].model.layers[0]
        # column-parallel: each rank's q/k/v and gate/up rows, exact
        for fused in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
            full = [IntegerLinear.from_tensors(t, f"model.layers.0.{p}")(x) for p in FUSED[fused]]
            want = torch.cat([y.chunk(2, -1)[rank] for y in full], -1)
            assert torch.equal(_sglang_linear(layer.get_submodule(fused))(x), want), (rank, fused)
        # row-parallel: s1 whole and s2/-z by groups are right, but qweight is cut along the packed bytes'
        # columns, which in the compute-order tiles are not the rank's half of K: SGLang TP>1 is wrong there
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            module, prefix = layer.get_submodule(name), f"model.layers.0.{name}"
            n, k = t[f"{prefix}.qweight"].shape[0], t[f"{prefix}.qweight"].shape[1] * 2
            assert torch.equal(module.s1_scales.data, t[f"{prefix}.s1_scales"])
            assert torch.equal(deinterleave_s2(module.s2_scales.data),
                               deinterleave_s2(t[f"{prefix}.s2_scales"]).chunk(2, 1)[rank])
            codes = unpack_qweight(module.qweight.data, n, k // 2)
            assert not torch.equal(codes, unpack_qweight(t[f"{prefix}.qweight"], n, k).chunk(2, 1)[rank])
