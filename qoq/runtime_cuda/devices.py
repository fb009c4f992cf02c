"""The check every kernel wrapper makes of its operands' devices: a kernel runs on its first operand's GPU
and reads every other operand there."""

from __future__ import annotations

import torch


def same_device(first_name: str, first: torch.Tensor, **others: torch.Tensor | None) -> None:
    """ValueError naming the first of `others` (None: not given) that is not on `first`'s device."""
    for name, t in others.items():
        if t is not None and t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} on {first.device}: every operand must be "
                             "on one GPU")
