"""Integer-valued test data and its closed-form results (the -c/--check oracle; no MPI).

Group rank g puts v(g, i) = f((g + i) mod P) at element i. The pattern keeps every partial result
an exactly representable integer in the row's dtype, so sum, prod, min and max are compared for
equality; avg (a division) is compared to within a few units in the last place. The reduced
result is periodic in i with period P, so the oracle costs P x p operations, not count x p.

  sum, avg   f(r) = r + 1 with P = m = min(4, limit / p): partial sums stay <= limit
             (int8 127, uint8 255, bfloat16 256, float16 2048); for larger groups an indicator
             (one rank per element holds 1) whose sum is 1
  prod       f(r) = 2 for r < t, else 1, P = p: the product is 2^t (t small enough for the type)
  min, max   f(r) = r + 1 with P = p + 1: each element misses exactly one value, so the result
             moves with i
  all_gather block j of the output is rank j's input, u(j, i) = (13 j + i) mod 97 + 1
  broadcast  the root holds u(0, i); the other ranks start from 0
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from fourd import _C

# numpy's type of each fourd dtype; bfloat16, which numpy lacks, is held as its uint16 bit
# pattern (to_storage / from_storage below; fourd reads it through fourd.Buffer.of).
NUMPY_STORAGE = {n: np.uint16 if n == "bfloat16" else np.dtype(n).type for n in _C.DTYPES}
# Largest integer every partial sum may reach and stay exact (and not overflow).
_SUM_LIMIT = {
    "int8": 127,
    "uint8": 255,
    "bfloat16": 256,
    "float16": 2048,
    "float32": 1 << 24,
    "int32": 1 << 30,
    "int64": 1 << 30,
    "float64": 1 << 30,
}
# Largest t with 2^t exact and in range.
_POW2_LIMIT = {
    "int8": 6,
    "uint8": 7,
    "float16": 15,
    "bfloat16": 120,
    "float32": 120,
    "int32": 30,
    "int64": 62,
    "float64": 1000,
}
_AVG_RTOL = {"float32": 1e-6, "float64": 1e-14, "float16": 2e-3, "bfloat16": 1.6e-2}


def to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 integer values -> an array of the row's storage type (bfloat16 as bit pattern)."""
    if dtype == "bfloat16":
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(values).astype(NUMPY_STORAGE[dtype])


def from_storage(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


@lru_cache(maxsize=256)
def _pattern(op: str, dtype: str, p: int) -> tuple[np.ndarray, int]:
    """(f over 0..P-1 as float64, P) for a reduction by `op` over p ranks."""
    if op in ("sum", "avg"):
        m = min(4, _SUM_LIMIT[dtype] // p)
        if m >= 1:
            return np.arange(1, m + 1, dtype=np.float64), m
        f = np.zeros(p)
        f[0] = 1.0
        return f, p
    if op == "prod":
        t = min(p, _POW2_LIMIT[dtype])
        return np.where(np.arange(p) < t, 2.0, 1.0), p
    if op in ("min", "max"):
        k = min(p + 1, 120 if dtype == "int8" else 250)
        return np.arange(1, k + 1, dtype=np.float64), k
    raise ValueError(f"op: expected sum, prod, min, max or avg; found {op!r}")


def _periodic(pattern: np.ndarray, start: int, n: int) -> np.ndarray:
    """Elements start..start+n-1 of the infinite repetition of `pattern` (np.tile: np.resize
    is orders of magnitude slower for short patterns)."""
    period = pattern.shape[0]
    shifted = np.roll(pattern, -(start % period))
    return np.tile(shifted, -(-n // period))[:n]


def reduce_input(op: str, dtype: str, p: int, g: int, n: int) -> np.ndarray:
    """Rank g's input of n elements for a reduction (float64 integer values)."""
    f, _ = _pattern(op, dtype, p)
    return _periodic(f, g, n)


@lru_cache(maxsize=64)
def _reduced_table(op: str, dtype: str, p: int) -> np.ndarray:
    f, period = _pattern(op, dtype, p)
    rows = np.stack([np.roll(f, -(g % period)) for g in range(p)])
    if op in ("sum", "avg"):
        t = rows.sum(0)
        return t / p if op == "avg" else t
    if op == "prod":
        return rows.prod(0)
    return rows.min(0) if op == "min" else rows.max(0)


def reduced(op: str, dtype: str, p: int, start: int, n: int) -> np.ndarray:
    """Elements start..start+n-1 of the reduction over the p ranks' inputs."""
    return _periodic(_reduced_table(op, dtype, p), start, n)


_GATHER_PATTERN = np.arange(1, 98, dtype=np.float64)


def gather_input(g: int, n: int) -> np.ndarray:
    return _periodic(_GATHER_PATTERN, 13 * g, n)


def gathered(p: int, n: int) -> np.ndarray:
    return np.concatenate([gather_input(j, n) for j in range(p)]) if p else np.zeros(0)


def count_wrong(got: np.ndarray, dtype: str, expected: np.ndarray, op: str | None = None) -> int:
    """Elements of `got` (storage type) that differ from `expected`: float64 values, or already
    in the storage type (compared bit for bit, the fast path for large buffers)."""
    if expected.dtype == got.dtype and op != "avg":
        return int(np.count_nonzero(got != expected))
    values = from_storage(got, dtype)
    if op == "avg" and dtype in _AVG_RTOL:
        ok = np.isclose(values, expected, rtol=_AVG_RTOL[dtype], atol=0.0)
        return int(values.size - np.count_nonzero(ok))
    return int(np.count_nonzero(values != expected))


class Oracle:
    """The check of one row: the input each group rank writes before a checked call and the
    result it must find after it, by the collective's closed forms (collectives.py), each
    computed once per row (clear() between rows)."""

    def __init__(self):
        self._cache: dict = {}

    def clear(self) -> None:
        self._cache.clear()

    def fill(self, coll, inp, res, in_place, op, dtype, p, g, root) -> None:
        """Writes group rank g's input into `inp`, after clearing `res` where the collective
        says so (a result left from an earlier call must not pass the check)."""
        if coll.clear_result(in_place):
            res.fill(0)
        key = ("in", coll.name, op, dtype, p, g, root, inp.size)
        a = self._cache.get(key)
        if a is None:
            a = self._cache[key] = to_storage(coll.source(op, dtype, p, g, root, inp.size), dtype)
        np.copyto(inp, a)

    def wrong(self, coll, res, op, dtype, p, g, count, block) -> int:
        """Wrong elements of group rank g's result `res`."""
        key = ("exp", coll.name, op, dtype, p, g, count)
        e = self._cache.get(key)
        if e is None:
            e = coll.expected(op, dtype, p, g, count, block)
            if op != "avg" or not coll.reduces:
                e = to_storage(e, dtype)  # exact integers: compare in the storage type
            self._cache[key] = e
        return count_wrong(res, dtype, e, op if coll.reduces else None)
