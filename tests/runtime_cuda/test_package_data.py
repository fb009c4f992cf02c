"""The CUDA sources ship with the package: a wheel install JIT-builds from the files that
pyproject.toml's package-data lists, so every file in csrc/ must match one of its patterns."""

import fnmatch
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (requires-python allows 3.10)
REPO = Path(__file__).resolve().parents[2]


def test_package_data_lists_every_csrc_file():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["qoq"]
    csrc = REPO / "qoq" / "runtime_cuda" / "csrc"
    files = sorted(p.relative_to(REPO / "qoq").as_posix() for p in csrc.iterdir() if p.is_file())
    assert files, "no sources found"
    missing = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)]
    assert not missing, f"not in package-data, so absent from an installed qoq: {missing}"
