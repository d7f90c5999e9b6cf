"""Kernels that mixers share, one folder per op with its reference beside its fast form (fla's layout):
`ops/<op>/naive.py` is the recurrence as the paper writes it (the tests' independent reference) and
`ops/<op>/chunk.py` the chunked form the mixers run.

- `gla/`: gated linear attention (`naive.py` the recurrence, `chunk.py` the chunked form, `fla_chunk.py` fla's
  Triton kernels where they import).
- `ssd/`: Mamba-2's state-space duality (`naive.py` the recurrence, `chunk.py` the chunked matrix form).
- `selective_scan/`: Mamba's selective scan (`naive.py` the float64 reference and an autograd loop, `stream.py`
  the PyTorch custom op with a hand-written backward, `cpp_scan.py` with `cpp_scan.cpp` the compiled loop the CPU
  runs, `triton_scan.py` the Triton kernels, `__init__.py` the dispatch `selective_scan` and `resolve_scan_impl`).
- `precision.py`: autocast switched off around the recurrences that accumulate in float32.
- `cpu_kernels.py`: builds and loads the compiled CPU kernels (C++ through ctypes); `eager_op.py`: their custom ops
  called without the dispatcher in plain eager on the CPU, the ops themselves wherever a compiler, counter or
  profiler watches."""
