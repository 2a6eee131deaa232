"""Turning torch tensors and numpy arrays into (address, element count, dtype code, device).

No copies: the native core works on the caller's memory. torch is optional: it is only looked
at when the caller passes a tensor.
"""

from __future__ import annotations

import sys

import numpy as np

from ._C import buffer_info as _buffer_info
from .errors import DTypeError, InvalidArgumentError

# Codes of fourd::DataType (cpp/include/fourd/data_type.hpp).
FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT8, UINT8, INT32, INT64 = range(8)
DTYPE_NAMES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
ITEMSIZE = [4, 8, 2, 2, 1, 1, 4, 8]

_NUMPY_CODES = {
    np.dtype(np.float32): FLOAT32,
    np.dtype(np.float64): FLOAT64,
    np.dtype(np.float16): FLOAT16,
    np.dtype(np.int8): INT8,
    np.dtype(np.uint8): UINT8,
    np.dtype(np.int32): INT32,
    np.dtype(np.int64): INT64,
}

_torch = None
_TORCH_CODES: dict = {}


def _torch_module():
    """torch if it is already imported by the caller (never imports it ourselves)."""
    global _torch
    if _torch is None:
        t = sys.modules.get("torch")
        if t is not None:
            _torch = t
            _TORCH_CODES.update(
                {
                    t.float32: FLOAT32,
                    t.float64: FLOAT64,
                    t.float16: FLOAT16,
                    t.bfloat16: BFLOAT16,
                    t.int8: INT8,
                    t.uint8: UINT8,
                    t.int32: INT32,
                    t.int64: INT64,
                }
            )
    return _torch


def _describe(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def resolve(obj, arg: str, writable: bool):
    """Returns (address, count, dtype_code, device_type, device_index) of a contiguous tensor or
    array. `arg` names the argument in error messages; `writable` means fourd writes into it."""
    if type(obj) is np.ndarray:
        info = _buffer_info(obj, writable)
        if info is not None:
            return info[0], info[1], info[2], 0, 0
    if isinstance(obj, np.ndarray):
        code = _NUMPY_CODES.get(obj.dtype)
        if code is None:
            raise DTypeError(
                f"{arg}: expected a numpy dtype among float32, float64, float16, int8, uint8, "
                f"int32, int64; found {obj.dtype}"
            )
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError(
                f"{arg}: expected a C-contiguous array, found one with strides {obj.strides} "
                f"(use np.ascontiguousarray)"
            )
        if writable and not obj.flags.writeable:
            raise InvalidArgumentError(f"{arg}: expected a writable array, found a read-only one")
        return obj.__array_interface__["data"][0], obj.size, code, 0, 0
    torch = _torch_module()
    if torch is not None and isinstance(obj, torch.Tensor):
        code = _TORCH_CODES.get(obj.dtype)
        if code is None:
            raise DTypeError(
                f"{arg}: expected a torch dtype among float32, float64, float16, bfloat16, int8, "
                f"uint8, int32, int64; found {obj.dtype}"
            )
        if not obj.is_contiguous():
            raise InvalidArgumentError(
                f"{arg}: expected a contiguous tensor, found one with strides {tuple(obj.stride())} "
                f"(call .contiguous())"
            )
        if writable and obj.requires_grad:
            raise InvalidArgumentError(
                f"{arg}: fourd would write into a tensor that requires grad; pass tensor.detach() "
                f"or use fourd.tensor_parallel's autograd functions"
            )
        if obj.is_cpu:
            return obj.data_ptr(), obj.numel(), code, 0, 0
        if obj.is_cuda:
            return obj.data_ptr(), obj.numel(), code, 1, obj.get_device()
        raise InvalidArgumentError(f"{arg}: expected a CPU or CUDA tensor, found device {obj.device}")
    raise DTypeError(f"{arg}: expected a torch.Tensor or numpy.ndarray, found {_describe(obj)}")


def set_cuda_stream(device_index: int) -> None:
    """Hands the current torch CUDA stream of `device_index` to the next collective issued from
    this thread (CUDA tensors only: the operation is ordered after that stream's work, and the
    stream waits for the operation's end)."""
    from . import _C

    setter = getattr(_C, "_cuda_set_stream", None)
    torch = _torch_module()
    if setter is not None and torch is not None:
        setter(torch.cuda.current_stream(device_index).cuda_stream)


def dtype_name(code: int) -> str:
    return DTYPE_NAMES[code]
