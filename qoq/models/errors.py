"""The errors of finding and reading a model (the loader and the embedded default raise them)."""


class ModelNotFoundError(FileNotFoundError):
    """The model name is neither a checkpoint directory, a known alias, nor a reachable hub id."""


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated or corrupt, or lacks a tensor the model needs."""
