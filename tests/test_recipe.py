import pytest

from qoq.models.config import ModelConfig
from qoq.passes.pipeline import check_compatible
from qoq.recipe import RecipeError, load_recipe, recipe_names


def test_every_shipped_recipe_loads():
    names = set(recipe_names())
    assert {"fp16", "w4a8kv4", "w4a8kv4g64", "w4a8kv4g128"} <= names
    assert {"w4a8kv4-rtn", "w4a8kv4g64-rtn", "w4a8kv4g128-rtn"} <= names
    r = load_recipe("w4a8kv4g128")
    assert (r.format.weight_bits, r.format.group_size, r.format.act_bits, r.format.kv_bits) == (4, 128, 8, 4)
    assert r.passes == ("rotation", "reorder", "smooth_attention", "smooth_down", "clip", "gptq")
    assert load_recipe("w4a8kv4g128-rtn").passes == ("rtn",)
    assert load_recipe("w4a8kv4").format.group_size == -1 and "reorder" not in load_recipe("w4a8kv4").passes
    assert load_recipe("fp16").passes == ()


@pytest.mark.parametrize("body, needle", [
    ('passes = ["rtn"]\nflavour = 1\n', "unknown key 'flavour'"),
    ('passes = ["rtn"]\n[format]\ngroupsize = 64\n', "unknown key 'format.groupsize'"),
    ('passes = ["rtn"]\n[format]\ngroup_size = 32\n', "'format.group_size' = 32"),
    ('passes = ["rtn"]\n[format]\nkv_bits = "4"\n', "'format.kv_bits' must be int"),
    ('passes = ["magic"]\n', "unknown pass 'magic'"),
    ('passes = []\n', "exactly one quantizing pass"),
    ('passes = ["rtn"]\n[calibration]\nsamples = 0\n', "'calibration.samples' must be positive"),
    ('passes = ["rtn"]\n[calibration]\npropagate = "fp"\n', "'calibration.propagate' = 'fp' is not one of"),
    ('passes = ["rtn"]\n[calibration]\nsampling = "all"\n', "'calibration.sampling' = 'all' is not one of"),
    ('passes = ["clip", "rtn"]\n[pass_options.clip]\ngrid = "20"\n', "'pass_options.clip.grid' must be int"),
    ('passes = ["rtn"]\n[pass_options.clip]\ngrid = 20\n', "'pass_options.clip' names a pass that is not in"),
    ('passes = ["clip", "rtn"]\n[pass_options.clip]\ngird = 20\n', "unknown key 'pass_options.clip.gird'"),
    ('passes = [\n', "not valid TOML"),
    # format combinations the executor does not run, and passes on formats they do not serve
    ('passes = ["rtn"]\n[format]\nact_bits = 4\n',
     "W4A4 takes 'format.weight_scheme' = \"symmetric\", not \"qoq\""),
    ('passes = ["rtn"]\n[format]\nweight_bits = 8\nact_bits = 4\n', "'format.act_bits' = 4 with 'format.weight_bits' = 8"),
    ('passes = ["rtn"]\n[format]\nact_bits = 4\nweight_scheme = "symmetric"\noutlier_channels = 128\n',
     "needs the 'outlier_reorder' pass"),
    (('passes = ["outlier_reorder", "rtn"]\n[format]\ngroup_size = -1\nact_bits = 4\nweight_scheme = "symmetric"\n'
      'outlier_channels = 128\n'), "'format.outlier_channels' needs the grouped symmetric W4A4 format"),
    ('passes = ["outlier_reorder", "rtn"]\n[format]\nact_bits = 4\nweight_scheme = "symmetric"\noutlier_channels = 100\n',
     "'format.outlier_channels' = 100 is not a multiple of 32"),
    ('passes = ["outlier_reorder", "rtn"]\n', "pass 'outlier_reorder' works on W4A4 formats, not W4A8"),
    ('passes = ["rtn"]\n[format]\nact_clip = 0.9\n', "'format.act_clip' applies to the symmetric"),
    ('passes = ["rtn"]\n[format]\nact_bits = 4\nweight_scheme = "symmetric"\nact_clip = 1.5\n',
     "'format.act_clip' = 1.5 is outside"),
    ('passes = ["rtn"]\n[format]\nweight_scheme = "nf4"\n', "'format.weight_scheme' = 'nf4' is not one of"),
    ('passes = ["rtn"]\n[format]\nweight_bits = 8\nact_bits = 8\nweight_scheme = "symmetric"\n',
     "W8A8 is per channel: 'format.group_size' must be -1"),
    ('passes = ["rtn"]\n[format]\nact_bits = 16\n', "W4A16 takes 'format.weight_scheme' = \"asymmetric\""),
    ('passes = ["rotation", "rtn"]\n[format]\nonline_hadamard = true\n',
     "'format.online_hadamard' applies to the symmetric W4A4 / W8A8 formats only"),
    ('passes = ["rtn"]\n[format]\nact_bits = 4\nweight_scheme = "symmetric"\nonline_hadamard = true\n',
     "'format.online_hadamard' needs the 'rotation' pass"),
    ('passes = ["rtn"]\n[format]\nkv_bits = 16\nk_bias_outside_cache = true\n',
     "'format.k_bias_outside_cache' applies to the KV4 cache only"),
    ('passes = ["awq", "rtn"]\n', "pass 'awq' works on W4A16 formats, not W4A8"),
    ('passes = ["smooth_down", "rtn"]\n[format]\nact_bits = 4\nweight_scheme = "symmetric"\n',
     "pass 'smooth_down' works on W4A8/W16A16 formats, not W4A4"),
    ('passes = ["smoothquant"]\n[format]\nweight_bits = 16\nact_bits = 16\n', "pass 'smoothquant' works on"),
])
def test_bad_recipe_names_key_and_file(tmp_path, body, needle):
    path = tmp_path / "mine.toml"
    path.write_text(body)
    with pytest.raises(RecipeError) as e:
        load_recipe(str(path))
    assert needle in str(e.value) and str(path) in str(e.value)


def test_unknown_recipe_name_lists_known():
    with pytest.raises(RecipeError, match="unknown recipe 'w4a16'.*w4a8kv4g128"):
        load_recipe("w4a16")


def test_g128_refuses_smollm2_shapes_and_points_to_alternatives():
    smollm2 = ModelConfig.from_hf({
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192, "tie_word_embeddings": True})
    with pytest.raises(RecipeError, match=r"K = 576 \(576 % 128 = 64\); use w4a8kv4g64 or w4a8kv4"):
        check_compatible(smollm2, load_recipe("w4a8kv4g128"))
    check_compatible(smollm2, load_recipe("w4a8kv4g64"))
    check_compatible(smollm2, load_recipe("w4a8kv4"))
