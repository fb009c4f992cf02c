"""CUDA runtime: kernels in csrc/, JIT-built with torch's extension loader (ninja), cached by source hash.

Errors, one convention for every extension: the Python wrappers (gemm.py, quant_kernels.py,
attention.py) check every argument and raise ValueError with a one-line message before any extension
call; the bindings (csrc/*_bindings.*) check what the kernels rely on again with TORCH_CHECK (a
RuntimeError in Python), a backstop for callers that reach an extension directly. On the device a
failing check in the bindings has been seen to end the process instead of raising, so the wrappers'
checks are the ones callers can rely on.
"""
