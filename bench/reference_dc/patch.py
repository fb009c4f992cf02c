"""Source edits deepcompressor-toolkit 0.1.0 needs to run QoQ on a CPU without network access.

Run with the reference venv's python (bench/reference_dc/setup.sh does). Each edit replaces one exact
snippet of the installed package and is idempotent: a snippet already edited is left alone, a snippet
found neither way stops with an error (a different deepcompressor version).

1. data/codebook.py: the JIT CUDA extension import becomes lazy (only codebook dtypes use it; int4 and
   int8 never do, and building it needs nvcc).
2. app/llm/nn/struct.py: head counts come from `module.config` (transformers 4.48+ dropped
   `num_heads` from the attention modules) and `position_embeddings` is passed to attention when a
   search evaluates it (as upstream later did).
3. app/llm/quant/dataset.py: the `pileval` loader reads a local text file (documents separated by blank
   lines) instead of the HF hub; its sampler is unchanged (shuffle with seed 42, one random window per
   document, concatenated and split). With DC_CALIB_TOKENS=path.pt it uses those token windows
   [samples, seq_len] as they are (the same calibration tokens as a qoq run).
4. app/llm/eval/custom.py: the WikiText-2 eval reads the local test rows (JSON lines, HF row order) and
   stops after DC_EVAL_WINDOWS windows when that is set.
"""

from __future__ import annotations

import sys
from pathlib import Path

import deepcompressor

ROOT = Path(deepcompressor.__file__).parent

LAZY_C = "        from deepcompressor.csrc.load import _C  # lazy: builds a CUDA extension\n"

EDITS = [
    ("data/codebook.py", "from deepcompressor.csrc.load import _C\n", "\n"),
    ("data/codebook.py",
     "        return _C.round_to_nearest_in_codebook_cuda(",
     LAZY_C + "        return _C.round_to_nearest_in_codebook_cuda("),
    ("app/llm/nn/struct.py",
     "with_rope, num_query_heads, num_key_value_heads = True, module.num_heads, module.num_key_value_heads",
     ("with_rope, num_query_heads, num_key_value_heads = (True, module.config.num_attention_heads, "
     "module.config.num_key_value_heads)")),
    ("app/llm/nn/struct.py",
     '            kwargs = (\n                "attention_mask",\n                "position_ids",\n',
     ('            kwargs = (\n                "position_embeddings",\n                "attention_mask",\n'
     '                "position_ids",\n')),
    ("app/llm/quant/dataset.py",
     '            dataset = load_dataset(path, split="validation")\n',
     ('            import datasets as _datasets  # local file: documents separated by blank lines\n'
     '            import re as _re\n'
     '            if os.environ.get("DC_CALIB_TOKENS"):\n'
     '                self.data = list(torch.load(os.environ["DC_CALIB_TOKENS"])[:num_samples])\n'
     '                return\n'
     '            with open(path, encoding="utf-8") as f:\n'
     '                docs = [p.strip() for p in _re.split(r"\\n\\s*\\n", f.read()) if p.strip()]\n'
     '            dataset = _datasets.Dataset.from_dict({"text": docs})\n')),
    ("app/llm/eval/custom.py",
     '        test_dataset = load_dataset("wikitext", "wikitext-2-raw-v1", split="test")\n',
     ('        import json as _json, os as _os  # local HF rows, one JSON object per line\n'
     '        with open(_os.environ["DC_WIKITEXT_TEST"], encoding="utf-8") as f:\n'
     '            test_dataset = {"text": [_json.loads(line)["text"] for line in f if line.strip()]}\n'
     '        max_num_samples = int(_os.environ.get("DC_EVAL_WINDOWS", max_num_samples))\n')),
]


def main() -> None:
    for rel, old, new in EDITS:
        path = ROOT / rel
        text = path.read_text()
        if new in text and (old not in text or old in new):
            continue  # applied before
        if text.count(old) != 1:
            sys.exit(f"patch: {rel}: expected exactly one occurrence of {old[:60]!r}, found {text.count(old)}")
        path.write_text(text.replace(old, new))
        print(f"patched {rel}")


if __name__ == "__main__":
    main()
