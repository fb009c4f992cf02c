"""CUDA runtime: kernels in csrc/, JIT-built with torch's extension loader (ninja), cached by source hash."""
