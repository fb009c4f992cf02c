"""CudaW4A8Linear: a quantized linear on the GPU kernels, built from docs/design.md §4 artifact tensors."""

from __future__ import annotations

import torch
from torch import nn

from qoq.runtime_cuda.gemm import tiles_for, w4a8_gemm
from qoq.runtime_cuda.quant_kernels import quant_tokens


class CudaW4A8Linear(nn.Module):
    """forward(x fp16 [..., K]) -> fp16 [..., N]: per-token INT8 quantization, then the W4A8 GEMM.

    The artifact layout is already the kernels' layout, so the tensors are used as stored.
    """

    def __init__(
        self,
        qweight: torch.Tensor,  # int8 [N, K/2]
        s1_scales: torch.Tensor,  # fp16 [N]
        s2_scales: torch.Tensor | None = None,  # int8 [K/g, N], interleaved
        s2_zeros: torch.Tensor | None = None,  # int8 [K/g, N], interleaved -z
        s1_szeros: torch.Tensor | None = None,  # fp16 [N], per channel
        bias: torch.Tensor | None = None,  # fp16 [N]
    ):
        super().__init__()
        n, k = qweight.shape[0], qweight.shape[1] * 2
        self.in_features, self.out_features = k, n
        if n % 32 or k % 32:
            raise ValueError(f"W4A8 kernels need N and K multiples of 32, got N={n}, K={k}")
        if (s2_scales is None) == (s1_szeros is None):
            raise ValueError("give s2_scales/s2_zeros (per group) or s1_szeros (per channel), exactly one")
        self.per_channel = s1_szeros is not None
        self.group_size = -1
        if not self.per_channel:
            if s2_zeros is None or s2_scales.shape != s2_zeros.shape or s2_scales.shape[1] != n:
                raise ValueError(f"s2_scales and s2_zeros must both be [K/g, {n}]")
            groups = s2_scales.shape[0]
            if k % groups or (k // groups) % 64:
                raise ValueError(f"group size K/groups = {k}/{groups} must be a multiple of 64")
            self.group_size = k // groups
        self._register("qweight", qweight, torch.int8, (n, k // 2))
        self._register("s1_scales", s1_scales, torch.float16, (n,))
        self._register("s2_scales", s2_scales, torch.int8, None)
        self._register("s2_zeros", s2_zeros, torch.int8, None)
        self._register("s1_szeros", s1_szeros, torch.float16, (n,))
        self._register("bias", bias, torch.float16, (n,))

    def _register(self, name: str, t: torch.Tensor | None, dtype: torch.dtype, shape) -> None:
        if t is not None:
            if t.dtype != dtype and not (dtype == torch.int8 and t.element_size() == 1):
                raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
            if shape is not None and tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
            t = t.view(dtype).contiguous()
        self.register_buffer(name, t)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str) -> "CudaW4A8Linear":
        """Build from `{prefix}.qweight`, `.s1_scales`, `.s2_scales`/`.s2_zeros` or `.s1_szeros`, `.bias`."""
        if f"{prefix}.qweight" not in tensors or f"{prefix}.s1_scales" not in tensors:
            raise KeyError(f"artifact tensors {prefix}.qweight and {prefix}.s1_scales are required")
        return cls(*(tensors.get(f"{prefix}.{name}") for name in
                     ("qweight", "s1_scales", "s2_scales", "s2_zeros", "s1_szeros", "bias")))

    @property
    def sums(self) -> str:
        """The per-token sums the GEMM needs from the quantization kernels (quant_kernels' `sums`)."""
        return "inputs" if self.per_channel else "codes"

    def forward_quantized(self, qx: torch.Tensor, s_x: torch.Tensor, sums: torch.Tensor | None) -> torch.Tensor:
        """GEMM of already quantized tokens: qx int8 [M, K] (or A-fragment tiles [K/32, 32, 16] where
        gemm.tiles_for(M, self.group_size)), s_x fp16 [M, 1] and the `self.sums` of the quantization kernel
        [M] (fp32 input sums per channel; int32 code sums per group, or None) -> [M, N].

        On Hopper the GEMM starts (and loads its first weights) while the kernel just ahead of it ends
        (w4a8_gemm's enable_pdl), so that kernel must not write this module's weights: in `forward` it is
        the input's quantization; callers pass tokens their quantization kernel has just made."""
        per_token = {"xsum": sums} if self.per_channel else {"qsum": sums}
        return w4a8_gemm(
            qx, s_x, self.qweight, self.s1_scales,
            s2_scales=self.s2_scales, s2_zeros=self.s2_zeros,
            s1_szeros=self.s1_szeros, bias=self.bias, enable_pdl=True, **per_token,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected input [..., {self.in_features}], got {tuple(x.shape)}")
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).half()
        tiles = tiles_for(rows.shape[0], self.group_size)  # the layout the GEMM auto_variant picks reads
        qx, s_x, sums = quant_tokens(rows, sums=self.sums, tiles=tiles)
        return self.forward_quantized(qx, s_x, sums).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        scheme = "per-channel" if self.per_channel else f"group={self.group_size}"
        return f"in_features={self.in_features}, out_features={self.out_features}, {scheme}"
