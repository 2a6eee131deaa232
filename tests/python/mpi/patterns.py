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
