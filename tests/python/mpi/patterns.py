"""Test data shared by the multi-rank suites (imported from their folder, which pytest puts on
sys.path)."""

import numpy as np


def repeat_to(period, count):
    """`period` repeated to `count` elements, by a broadcast copy: several times faster than
    np.resize, np.tile or index arithmetic on the 2**20-element calls, whose checks otherwise
    cost more than the collectives."""
    out = np.empty((count // len(period) + 1, len(period)), period.dtype)
    out[:] = period
    return out.reshape(-1)[:count]


def values(rank, count, offset=0):
    """Per-rank integer values 1..4, exact in every dtype: (rank + 1 + i % 3) % 4 + 1 for
    element i (counted from `offset`), a pattern of period 3."""
    i = np.arange(offset, offset + 3)
    return repeat_to(((rank + 1 + i % 3) % 4 + 1).astype(np.float64), count)


def oracle(op, ranks, count, offset=0):
    """The expected result: one period of values() (it repeats every 3 elements) reduced over
    the ranks, repeated to `count` (the large counts' world calls need no rank-by-count array,
    which is 512 MB per process on 8 ranks)."""
    vals = np.stack([values(r, 3, offset) for r in ranks])
    if op == "sum":
        out = vals.sum(0)
    elif op == "prod":
        out = vals.prod(0)
    elif op == "min":
        out = vals.min(0)
    elif op == "max":
        out = vals.max(0)
    else:
        out = vals.sum(0) / len(ranks)
    return repeat_to(out, count)
