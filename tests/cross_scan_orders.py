"""vmamba's four scan orders of an H x W grid written out cell by cell: the tests' independent statement of what
`mixers.vmamba.scan_orders` builds with index ops (the kernel's order tests and vmamba's reference both use it)."""
from __future__ import annotations


def cross_scan_orders(H: int, W: int) -> list[list[int]]:
    """The row-major token index of each step of the four orders: rows, columns, and each reversed."""
    rows = [r * W + c for r in range(H) for c in range(W)]
    cols = [r * W + c for c in range(W) for r in range(H)]
    return [rows, cols, rows[::-1], cols[::-1]]
