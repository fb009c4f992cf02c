"""The inference engine: paged KV, continuous batching, sampling, on a CPU reference or a CUDA runner.
(Names load lazily, so `qoq --help` does not import torch.)"""

_EXPORTS = {"LLMEngine": "qoq.engine.engine", "SamplingParams": "qoq.engine.params",
            "Completion": "qoq.engine.sequence", "RequestOutput": "qoq.engine.sequence"}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'qoq.engine' has no attribute {name!r}")
