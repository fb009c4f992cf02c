"""JIT build of the CUDA extensions, cached in a folder keyed by the sources' hash.

One extension per kernel family keeps translation units few (build minutes are device minutes).
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"


def _cache_root() -> Path:
    root = os.environ.get("QOQ_CUDA_BUILD_DIR")
    return Path(root) if root else Path.home() / ".cache" / "qoq" / "cuda"


def _arch_flags() -> list[str]:
    import torch

    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise RuntimeError(f"qoq's CUDA kernels need sm_80 or newer; this GPU is sm_{major}{minor}")
    cc = f"{major}{minor}"
    # sm_90a unlocks wgmma/setmaxnreg on Hopper; plain sm_XY elsewhere.
    arch = f"{cc}a" if major == 9 else cc
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def build_tree(name: str, csrc: Path, sources: tuple[str, ...], build_dir: Path, verbose: bool = False):
    """Build (or reuse) the extension `name` from files in the source tree `csrc` into `build_dir`, with
    the package's compiler flags (bench/ab_csrc_h200.py builds two trees side by side this way)."""
    from torch.utils.cpp_extension import load

    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=name,
        sources=[str(csrc / s) for s in sources],
        extra_include_paths=[str(csrc)],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", *_arch_flags()],
        build_directory=str(build_dir),
        verbose=verbose,
    )


@lru_cache(maxsize=None)
def load_extension(name: str, sources: tuple[str, ...], verbose: bool = False):
    """Build (or reuse) the extension `name` from files in csrc/ and return the loaded module."""
    import torch

    headers = sorted(CSRC.glob("*.cuh")) + sorted(CSRC.glob("*.h"))
    digest = hashlib.sha256()
    for p in [CSRC / s for s in sources] + headers:
        digest.update(p.name.encode())
        digest.update(p.read_bytes())
    digest.update(torch.__version__.encode())
    return build_tree(name, CSRC, sources, _cache_root() / f"{name}-{digest.hexdigest()[:16]}", verbose)
