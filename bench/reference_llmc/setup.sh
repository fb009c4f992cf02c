#!/usr/bin/env bash
# Build llm-compressor's own venv for bench/reference_llmc/run.py. Never a dependency of qoq: a
# separate venv, CPU torch.
#   bash bench/reference_llmc/setup.sh [VENV]      (default ~/.cache/qoq/llmc-venv)
set -euo pipefail
VENV=${1:-${LLMC_VENV:-$HOME/.cache/qoq/llmc-venv}}
PY=${LLMC_PYTHON:-python3.11}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip install -q"
$PIP "torch==2.13.0"
# llm-compressor and the versions its resolver picked here (pinned so the rows can be rerun)
$PIP "llmcompressor==0.14.0.1" "compressed-tensors==0.19.0" "transformers==5.17.0" "accelerate==1.15.0" \
  "datasets==5.2.0"
echo "llm-compressor venv ready: $VENV"
