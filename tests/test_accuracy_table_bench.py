"""bench/accuracy_table.py: the summary's figures from rows (no quantization runs here; no plot check:
matplotlib is not a test dependency)."""

import json

import pytest

from bench.accuracy_table import load, summarize, write


def row(model, recipe, ppl, windows=8, tool="qoq"):
    return {"model": model, "recipe": recipe, "tool": tool, "windows": windows, "ppl": ppl, "quantize_seconds": 1.0}


def test_gap_closed_and_w4a4_comparison():
    big = "qwen2.5-coder-1.5b"
    rows = [row(big, "fp16", 10.0, 40), row(big, "w4a8kv4g128-rtn", 14.0, 40), row(big, "w4a8kv4g128", 11.0, 40),
            row(big, "atom-w4a4kv4g128", 12.0, 40), row(big, "quarot-w4a4kv4", 10.5, 40),
            row("smollm2-135m", "w4a8kv4g64", 24.0), row("smollm2-135m", "atom-w4a4kv4g64", 30.0),
            row("smollm2-135m", "quarot-w4a4kv4", 31.0)]
    s = summarize(rows)
    assert s["gap_closed_g128_1p5b"] == pytest.approx(0.75) and s["windows_1p5b"] == 40
    assert s["qoq_g128_1p5b_over_fp16"] == pytest.approx(1.1)
    assert (s["fp16_1p5b_ppl"], s["qoq_g128_1p5b_ppl"], s["rtn_g128_1p5b_ppl"]) == (10.0, 11.0, 14.0)
    assert s["qoq_beats_w4a4"] == {big: False, "smollm2-135m": True}  # QuaRot's 10.5 beats QoQ's 11 there


def test_figures_on_different_windows_are_not_compared():
    big = "qwen2.5-coder-1.5b"
    rows = [row(big, "fp16", 10.0, 40), row(big, "w4a8kv4g128-rtn", 14.0, 8), row(big, "w4a8kv4g128", 11.0, 40),
            row(big, "fp16", 10.4, 8)]
    s = summarize(rows)
    assert s["models"][big]["fp16"] == {"ppl": 10.0, "windows": 40, "quantize_seconds": 1.0, "tool": "qoq"}
    assert s["gap_closed_g128_1p5b"] is None and "gap_closed_g128_1p5b" in s["null_reasons"]
    assert s["qoq_beats_w4a4"] == {} and f"qoq_beats_w4a4.{big}" in s["null_reasons"]


def test_w4a4_comparison_cuts_a_longer_run_to_the_shorter_windows():
    """QoQ on 4 windows (its per-window NLLs kept), Atom and QuaRot on 2: compared on the first 2."""
    model = "qwen2.5-coder-0.5b"
    qoq_row = {**row(model, "w4a8kv4g128", 20.0, 4), "nll_per_window": [3.0, 3.2, 2.0, 2.0]}
    # Atom's 22.0 beats QoQ's first-2 perplexity e^3.1 = 22.198, though not its 4-window 20.0
    rows = [qoq_row, row(model, "atom-w4a4kv4g128", 22.0, 2), row(model, "quarot-w4a4kv4", 40.0, 2)]
    s = summarize(rows)
    assert s["qoq_beats_w4a4"] == {model: False} and s["qoq_beats_w4a4_windows"] == {model: 2}
    rows[1]["ppl"] = 22.5
    assert summarize(rows)["qoq_beats_w4a4"] == {model: True}
    del qoq_row["nll_per_window"]  # without them the 4-window row cannot stand for 2 windows
    assert summarize(rows)["qoq_beats_w4a4"] == {} and f"qoq_beats_w4a4.{model}" in summarize(rows)["null_reasons"]


def test_write_merges_llmcompressor_and_breakdown_rows(tmp_path):
    check = {"smollm2-135m": {"commit": "abc", "qoq_rows": [
        {"tool": "qoq", "scheme": "fp", "ppl": 19.1, "windows": 8},
        {"tool": "qoq", "scheme": "gptq-w4a16g64", "ppl": 23.8, "windows": 8}],
        "llmcompressor_rows": [{"tool": "llmcompressor 0.14", "scheme": "gptq-w4a16g64", "ppl": 24.0, "windows": 8},
                               {"tool": "llmcompressor 0.14", "scheme": "awq-w4a16g64", "ppl": None, "windows": 8}]}}
    (tmp_path / "llmcompressor_check.json").write_text(json.dumps(check))
    (tmp_path / "error_breakdown_x.json").write_text(json.dumps(
        {"model": "smollm2-135m", "windows": 8, "rows": [{"row": "KV4 only", "recipe": "r", "ppl": 21.4}]}))
    table = {"rows": [row("smollm2-135m", "gptq-w4a16g64", 23.5)]}  # ours, measured here: wins over the check's
    write(table, tmp_path)
    out = load(tmp_path / "accuracy_table.json")
    models = out["summary"]["models"]["smollm2-135m"]
    assert models["gptq-w4a16g64"]["ppl"] == 23.5 and models["fp16"]["ppl"] == 19.1
    assert models["gptq-w4a16g64 (llmcompressor)"] == {"ppl": 24.0, "windows": 8, "quantize_seconds": None,
                                                       "tool": "llmcompressor"}
    assert out["error_breakdown"][0]["row"] == "KV4 only"
    md = (tmp_path / "accuracy_table.md").read_text()
    assert "| gptq-w4a16g64 | llmcompressor | 8 | 24.000 |" in md


def test_merge_adds_rows_measured_elsewhere(tmp_path):
    from bench.accuracy_table import main

    here, there = tmp_path / "here", tmp_path / "there"
    big = "qwen2.5-coder-1.5b"
    write({"rows": [row(big, "fp16", 10.0, 40), row(big, "w4a8kv4g128", 12.0, 40)]}, here)
    write({"rows": [row(big, "w4a8kv4g128", 11.0, 40), row(big, "w4a8kv4g128-rtn", 14.0, 40)]}, there)
    main(["merge", str(there / "accuracy_table.json"), "--results", str(here)])
    merged = load(here / "accuracy_table.json")
    assert sorted((r["recipe"], r["ppl"]) for r in merged["rows"]) == [
        ("fp16", 10.0), ("w4a8kv4g128", 11.0), ("w4a8kv4g128-rtn", 14.0)]  # the newer run's row replaced ours
    assert merged["summary"]["gap_closed_g128_1p5b"] == pytest.approx(0.75)


def test_supersede_moves_rows_of_an_earlier_recipe_out_of_the_summary(tmp_path):
    """Rows measured before a recipe changed (not at --before or a --keep commit) become superseded_rows; the
    breakdown of a file marked superseded gives no whole-recipe row, so the new measurement stands alone."""
    from bench.accuracy_table import main

    big = "qwen2.5-coder-1.5b"
    old = [{**row(big, "w4a8kv4g128", 5305.0, 40), "commit": "77f5c72"},
           {**row(big, "fp16", 12.9, 40), "commit": "77f5c72"},
           {**row(big, "w4a8kv4g128-rtn", 13.9, 40), "commit": "9b96c6d (copy)"}]
    write({"rows": old}, tmp_path)
    (tmp_path / "error_breakdown_old.json").write_text(json.dumps(
        {"model": big, "windows": 4, "superseded": "k bias cached", "rows": [
            {"row": "FP16", "recipe": None, "ppl": 36.9}, {"row": "W4A8KV4", "recipe": "w4a8kv4g128", "ppl": 63.0}]}))
    main(["supersede", "--model", big, "--recipes", "w4a8kv4g128,w4a8kv4g128-rtn", "--before", "9b96c6d",
          "--reason", "k bias cached", "--results", str(tmp_path)])
    out = load(tmp_path / "accuracy_table.json")
    assert [(r["recipe"], r["superseded"], r["recipe_changed_at"]) for r in out["superseded_rows"]] == [
        ("w4a8kv4g128", "k bias cached", "9b96c6d")]
    assert sorted(out["summary"]["models"][big]) == ["fp16", "w4a8kv4g128-rtn"]  # fp16 untouched, RTN kept
    assert out["error_breakdown"][1]["superseded"] == "k bias cached"
    assert [(r["recipe"], r["windows"]) for r in out["other_rows"]] == [("fp16", 4)]  # the fp16 row still counts
    assert "## Superseded rows" in (tmp_path / "accuracy_table.md").read_text()
