"""Kernels that mixers share, one folder per op with its reference beside its fast form (fla's layout):
`ops/<op>/naive.py` is the recurrence as the paper writes it (the tests' independent reference) and
`ops/<op>/chunk.py` the chunked form the mixers run. The selective scan predates this folder and stays in
`mixers/selective_scan.py`."""
