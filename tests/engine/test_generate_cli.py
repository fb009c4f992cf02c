"""`qoq generate`: streamed text equals the engine's; --json carries ids, reason, timings."""

import json

from typer.testing import CliRunner

from qoq.cli import app
from qoq.engine import LLMEngine, SamplingParams


def test_generate_json_and_stream_match_the_engine(tiny_w4):
    expected = LLMEngine(tiny_w4).generate(["The game"], SamplingParams(max_tokens=6))[0]
    runner = CliRunner()
    res = runner.invoke(app, ["generate", str(tiny_w4), "--prompt", "The game", "--max-tokens", "6", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["token_ids"] == expected.token_ids and data["text"] == expected.text
    assert data["finish_reason"] == expected.finish_reason and data["timings"]["total_s"] > 0
    streamed = runner.invoke(app, ["generate", str(tiny_w4), "--prompt", "The game", "--max-tokens", "6"])
    assert streamed.exit_code == 0 and streamed.stdout == expected.text + "\n"


def test_generate_refuses_chat_without_template(tiny_w4):
    res = CliRunner().invoke(app, ["generate", str(tiny_w4), "--prompt", "hi", "--chat"])
    assert res.exit_code == 1 and "chat template" in res.stderr


def test_generate_quantization_option_reaches_the_engine(tiny_fp16):
    runner = CliRunner()
    res = runner.invoke(app, ["generate", str(tiny_fp16), "--prompt", "hi", "--quantization", "fp8"])
    assert res.exit_code == 1 and "quantization='fp8' runs on the cuda backend only" in res.stderr
    res = runner.invoke(app, ["generate", str(tiny_fp16), "--prompt", "hi", "--backend", "cuda",
                              "--quantization", "int8"])
    assert res.exit_code == 1 and "unknown quantization 'int8'" in res.stderr
