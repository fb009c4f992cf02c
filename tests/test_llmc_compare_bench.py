"""bench/reference_llmc/compare.py: llm-compressor's rows compared over fewer windows than they were run on."""

import json
import math

from bench.reference_llmc.compare import first_windows, llmc_rows


def test_a_longer_run_is_cut_to_its_first_windows(tmp_path):
    nll = [1.0, 2.0, 3.0, 4.0]
    row = {"scheme": "gptq-w4a16g128", "ppl": math.exp(2.5), "windows": 4, "nll_per_window": nll,
           "calibration": {"source": "t.pt"}}
    cut = first_windows(row, 2)
    assert cut["windows"] == 2 and math.isclose(cut["ppl"], math.exp(1.5)) and cut["cut_from_windows"] == 4
    assert first_windows(row, 4) is row and first_windows(row, 8) is None
    assert first_windows({**row, "nll_per_window": None}, 2) is None
    other = {**row, "scheme": "smoothquant-w8a8", "calibration": {"source": "other.pt"}}  # other tokens: left out
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (row, other)))
    rows = llmc_rows(tmp_path, 2, tmp_path / ".." / "t.pt")
    assert rows == {} and list(llmc_rows(tmp_path, 2, "t.pt")) == ["gptq-w4a16g128"]
    assert math.isclose(llmc_rows(tmp_path, 3, "t.pt")["gptq-w4a16g128"]["ppl"], math.exp(2.0))
