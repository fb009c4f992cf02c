#!/usr/bin/env bash
# Build the reference implementation's own venv (deepcompressor-toolkit 0.1.0, QoQ) for
# bench/reference_dc/run.py. Never a dependency of qoq: a separate venv, CPU torch.
#   bash bench/reference_dc/setup.sh [VENV]      (default ~/.cache/qoq/dc-venv)
set -euo pipefail
VENV=${1:-${DC_VENV:-$HOME/.cache/qoq/dc-venv}}
PY=${DC_PYTHON:-python3.11}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip install -q"
# torch first, CPU build; the wheel itself without its (CUDA-era) pins.
$PIP "torch==2.13.0"
$PIP --no-deps "deepcompressor-toolkit==0.1.0"
$PIP "transformers==4.49.0" "accelerate==1.4.0" "datasets==3.3.2" "omniconfig==0.1.10" \
  "lm_eval==0.4.7" einops sentencepiece scipy psutil jieba fuzzywuzzy rouge pytablewriter
# The four source edits deepcompressor 0.1.0 needs on a CPU without network (see patch.py).
"$VENV/bin/python" "$HERE/patch.py"
echo "reference venv ready: $VENV"
