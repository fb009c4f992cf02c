"""Our own Llama-family decoder: config -> weights -> forward (see docs/structure.md)."""

from qoq.models.config import ModelConfig, UnsupportedModelError
from qoq.models.llama import BLOCK_LINEARS, BLOCK_NORMS, Attention, Block, CausalLM, MLP, RMSNorm
from qoq.models.loader import (
    CheckpointError,
    CheckpointReader,
    ModelNotFoundError,
    load_block,
    load_model,
    load_skeleton,
    load_tokenizer,
    resolve_model,
)

__all__ = [
    "Attention", "BLOCK_LINEARS", "BLOCK_NORMS", "Block", "CausalLM", "CheckpointError", "CheckpointReader", "MLP", "ModelConfig",
    "ModelNotFoundError", "RMSNorm", "UnsupportedModelError", "load_block", "load_model", "load_skeleton",
    "load_tokenizer", "resolve_model",
]  # fmt: skip
