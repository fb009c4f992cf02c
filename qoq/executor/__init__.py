"""The executor: an artifact run as a CausalLM, by the integer-exact torch reference or CUDA kernels."""

from qoq.executor.build import LINEAR_BACKENDS, load_artifact_model

__all__ = ["LINEAR_BACKENDS", "load_artifact_model"]
