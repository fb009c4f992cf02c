"""The inference engine: paged KV, continuous batching, sampling, on a CPU reference or a CUDA runner."""

from qoq.engine.engine import LLMEngine
from qoq.engine.params import SamplingParams
from qoq.engine.sequence import Completion, RequestOutput

__all__ = ["LLMEngine", "SamplingParams", "Completion", "RequestOutput"]
