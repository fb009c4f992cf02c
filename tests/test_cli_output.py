"""What `qoq` prints: a human rendering or JSON (--json) on every verb, --version, clean help, no
wrapping when piped, no machine paths; and the recipe errors a new user meets first."""

import json

import pytest
from typer.testing import CliRunner

import qoq
from checkpoints import make_tiny_checkpoint
from qoq.cli import app
from qoq.recipe import RECIPE_DIR

runner = CliRunner()
FAST = 'description = "test"\npasses = ["rtn"]\n[format]\ngroup_size = 64\n[calibration]\nsamples = 2\nseq_len = 64\n'


def qoq_cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_tokenizer):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", tiny_tokenizer)


def test_version_and_help():
    assert qoq_cli("--version").stdout == f"qoq {qoq.__version__}\n"
    top = qoq_cli("--help").stdout
    assert "--debug" in top and "QOQ_DEBUG" in top and "--version" in top
    for verb in (["eval"], ["quantize"], ["inspect"], ["recipes", "show"]):
        text = qoq_cli(*verb, "--help").stdout
        assert "<bool>" not in text and "<str>" not in text and "{" not in text, text
    assert "eval [OPTIONS] TASK MODEL" in qoq_cli("eval", "--help").stdout
    usage = qoq_cli("eval", "wikitext2", "x", "--windows", "abc")
    assert usage.exit_code == 2 and usage.stderr.count("\n") == 1, usage.stderr
    assert usage.stderr.startswith("error: Invalid value for '--windows'") and "--help" in usage.stderr


def test_recipes_human_and_json_without_machine_paths():
    listed = qoq_cli("recipes").stdout.splitlines()
    columns = {len(line) - len(line[len(line.split()[0]):].lstrip()) for line in listed}
    assert len(columns) == 1, listed  # every description starts in one column
    human, as_json = qoq_cli("recipes", "show", "w4a8kv4g128-rtn"), qoq_cli("recipes", "show", "w4a8kv4g128-rtn", "--json")
    assert human.exit_code == as_json.exit_code == 0 and human.stdout != as_json.stdout
    assert json.loads(as_json.stdout)["source"] == "recipes/w4a8kv4g128-rtn.toml"
    assert human.stdout.startswith("w4a8kv4g128-rtn ") and "passes" in human.stdout
    for text in (human.stdout, as_json.stdout):
        assert str(RECIPE_DIR) not in text


def test_eval_human_by_default_json_on_request(tiny_dir, shared_data):
    human = qoq_cli("eval", "wikitext2", tiny_dir, "--windows", 1, "--data-dir", shared_data)
    assert human.exit_code == 0 and human.stdout.startswith("wikitext2 perplexity "), human.output
    with pytest.raises(json.JSONDecodeError):
        json.loads(human.stdout)
    data = json.loads(qoq_cli("eval", "wikitext2", tiny_dir, "--windows", 1, "--data-dir", shared_data, "--json").stdout)
    assert data["windows"] == 1 and data["ppl"] > 1


def test_piped_quantize_summary_is_one_line_and_inspect_has_both_renderings(tiny_dir, tmp_path, shared_data,
                                                                           monkeypatch):
    recipe = tmp_path / "fast.toml"
    recipe.write_text(FAST)
    out = tmp_path / "a-rather-long-output-directory-name" / "so-that-the-summary-passes-eighty-columns"
    result = qoq_cli("quantize", "--model", tiny_dir, "--recipe", recipe, "--output", out, "--data-dir", shared_data)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and len(lines[0]) > 80 and lines[0].startswith(f"wrote {out} "), lines
    import qoq.export.artifact as artifact_mod

    def no_load(*args, **kwargs):
        raise AssertionError("inspect loaded the tensors")

    monkeypatch.setattr(artifact_mod, "load_file", no_load)  # inspect streams checksums instead
    human, as_json = qoq_cli("inspect", out), qoq_cli("inspect", out, "--json")
    assert json.loads(as_json.stdout)["quantized_linears"] == 14 and "tensor formats" in human.stdout


def test_recipe_errors_name_the_file_and_the_options(tmp_path):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\x00\xff\xfe\x80 recipe")
    result = qoq_cli("recipes", "show", binary)
    assert result.exit_code == 1 and result.stderr.startswith(f"error: {binary}: not a text file"), result.stderr
    options = tmp_path / "options.toml"
    options.write_text(FAST.replace('passes = ["rtn"]', 'passes = ["reorder", "rtn"]') + "[pass_options.reorder]\nx = 1\n")
    result = qoq_cli("recipes", "show", options)
    assert result.exit_code == 1 and "unknown key 'pass_options.reorder.x' (known: none" in result.stderr


def test_json_is_always_valid_json():
    from qoq.cli_errors import json_text

    text = json_text({"ppl": float("nan"), "windows": [1.0, float("inf")], "ok": 2.5})
    assert json.loads(text) == {"ppl": None, "windows": [1.0, None], "ok": 2.5} and "NaN" not in text
