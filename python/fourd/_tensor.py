"""Turning torch tensors, numpy arrays and :class:`Buffer` views into (address, element count,
dtype code, device, device index, stream).

No copies: the native core works on the caller's memory. torch is optional: it is only looked
at when the caller passes a tensor. The dtype names and codes are the native core's
(``fourd._C.DTYPES``, in code order); nothing here repeats them.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _C
from ._C import buffer_info as _buffer_info
from .errors import DTypeError, InvalidArgumentError

DTYPES = _C.DTYPES  # names in code order (fourd::DataType)
CODES = {name: code for code, name in enumerate(DTYPES)}
ITEMSIZE = dict(zip(DTYPES, _C.DTYPE_SIZES))

# numpy knows every fourd dtype but bfloat16 (its bit pattern travels as uint16 in a Buffer).
_NUMPY_CODES = {}
for _name, _code in CODES.items():
    try:
        _NUMPY_CODES[np.dtype(_name)] = _code
    except TypeError:
        pass

_torch = None
_TORCH_CODES: dict = {}
# The types the blocking hot paths' native calls (Communicator.*_array) read themselves: numpy
# arrays, and torch.Tensor once torch is seen (a contiguous CPU tensor; the call returns False
# for another, and the caller takes the general path).
FAST_TYPES = {np.ndarray}
_DEVICES = {"cpu": 0, "cuda": 1}


def _torch_module():
    """torch if it is already imported by the caller (never imports it ourselves)."""
    global _torch
    if _torch is None:
        t = sys.modules.get("torch")
        if t is not None:
            _torch = t
            _TORCH_CODES.update({getattr(t, n): c for n, c in CODES.items() if hasattr(t, n)})
            _C.set_torch(t.Tensor, _TORCH_CODES)  # the native hot paths take its tensors
            FAST_TYPES.add(t.Tensor)
    return _torch


def _describe(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class Buffer:
    """A view of memory as fourd sees it: an address, an element count, a dtype, a device.

    ``Buffer.of(obj, dtype)`` reinterprets a contiguous array or tensor as another dtype of the
    same element size, such as a numpy ``uint16`` array as ``"bfloat16"`` (numpy has no
    bfloat16); ``Buffer(address, count, dtype)`` wraps raw memory the caller owns. Every
    collective accepts a Buffer wherever it accepts a tensor. The Buffer keeps `owner` alive;
    raw addresses must stay valid until the call (or its Work) completes.
    """

    __slots__ = ("address", "count", "dtype", "device", "device_index", "owner", "stream")

    def __init__(
        self,
        address: int,
        count: int,
        dtype: str,
        device: str = "cpu",
        device_index: int = 0,
        owner=None,
        stream: int = 0,
    ):
        if dtype not in CODES:
            raise DTypeError(f"dtype: expected one of {', '.join(DTYPES)}; found {dtype!r}")
        if device not in _DEVICES:
            raise InvalidArgumentError(f"device: expected 'cpu' or 'cuda', found {device!r}")
        if not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(f"count: expected an element count >= 0, found {count!r}")
        self.address = int(address)
        self.count = count
        self.dtype = dtype
        self.device = device
        self.device_index = int(device_index)
        self.owner = owner
        self.stream = int(stream)

    @classmethod
    def of(cls, obj, dtype: str | None = None, arg: str = "obj") -> Buffer:
        """A Buffer over a contiguous tensor or array; with `dtype`, its bytes read as that
        dtype (the element size must match)."""
        if dtype is not None and dtype not in CODES:
            raise DTypeError(f"dtype: expected one of {', '.join(DTYPES)}; found {dtype!r}")
        if dtype is not None and isinstance(obj, np.ndarray) and obj.dtype not in _NUMPY_CODES:
            # A bit pattern numpy has no type for (bfloat16 as uint16): any same-size dtype.
            if not obj.flags.c_contiguous:
                raise InvalidArgumentError(f"{arg}: expected a C-contiguous array")
            if obj.itemsize != ITEMSIZE[dtype]:
                raise DTypeError(
                    f"dtype: {dtype} elements are {ITEMSIZE[dtype]} bytes, {arg}'s "
                    f"{obj.dtype} elements {obj.itemsize}"
                )
            return cls(obj.__array_interface__["data"][0], obj.size, dtype, owner=obj)
        p, n, code, dev, idx, stream = resolve(obj, arg, False)
        name = DTYPES[code]
        if dtype is not None and dtype != name:
            if ITEMSIZE[dtype] != ITEMSIZE[name]:
                raise DTypeError(
                    f"dtype: {dtype} elements are {ITEMSIZE[dtype]} bytes, {arg}'s "
                    f"{name} elements {ITEMSIZE[name]}"
                )
            name = dtype
        return cls(p, n, name, "cuda" if dev else "cpu", idx, owner=obj, stream=stream)

    @property
    def nbytes(self) -> int:
        return self.count * ITEMSIZE[self.dtype]

    def __repr__(self) -> str:
        return (
            f"fourd.Buffer(0x{self.address:x}, count={self.count}, dtype='{self.dtype}', "
            f"device='{self.device}:{self.device_index}')"
        )


def _numpy(obj: np.ndarray, arg: str, writable: bool):
    code = _NUMPY_CODES.get(obj.dtype)
    if code is None:
        names = ", ".join(DTYPES[c] for c in _NUMPY_CODES.values())
        raise DTypeError(
            f"{arg}: expected a numpy dtype among {names}; found {obj.dtype} (a "
            f"bfloat16 bit pattern: fourd.Buffer.of(array, 'bfloat16'))"
        )
    if not obj.flags.c_contiguous:
        raise InvalidArgumentError(
            f"{arg}: expected a C-contiguous array, found one with strides {obj.strides} "
            f"(use np.ascontiguousarray)"
        )
    if writable and not obj.flags.writeable:
        raise InvalidArgumentError(f"{arg}: expected a writable array, found a read-only one")
    return obj.__array_interface__["data"][0], obj.size, code, 0, 0, 0


def _tensor(torch, obj, arg: str, writable: bool):
    code = _TORCH_CODES.get(obj.dtype)
    if code is None:
        raise DTypeError(
            f"{arg}: expected a torch dtype among {', '.join(DTYPES)}; found {obj.dtype}"
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
        return obj.data_ptr(), obj.numel(), code, 0, 0, 0
    if obj.is_cuda:
        idx = obj.get_device()
        return obj.data_ptr(), obj.numel(), code, 1, idx, torch.cuda.current_stream(idx).cuda_stream
    raise InvalidArgumentError(f"{arg}: expected a CPU or CUDA tensor, found device {obj.device}")


def resolve(obj, arg: str, writable: bool):
    """(address, count, dtype_code, device_type, device_index, stream) of a contiguous tensor,
    array or Buffer. `arg` names the argument in error messages; `writable` means fourd writes
    into it. For a CUDA tensor, `stream` is torch's current stream of its device (the
    operation is ordered after it), else 0."""
    if type(obj) is np.ndarray:
        info = _buffer_info(obj, writable)
        if info is not None:
            return info[0], info[1], info[2], 0, 0, 0
    if isinstance(obj, np.ndarray):
        return _numpy(obj, arg, writable)
    if isinstance(obj, Buffer):
        return (
            obj.address,
            obj.count,
            CODES[obj.dtype],
            _DEVICES[obj.device],
            obj.device_index,
            obj.stream,
        )
    torch = _torch_module()
    if torch is not None and isinstance(obj, torch.Tensor):
        return _tensor(torch, obj, arg, writable)
    raise DTypeError(
        f"{arg}: expected a torch.Tensor, numpy.ndarray or fourd.Buffer, found {_describe(obj)}"
    )


def dtype_name(code: int) -> str:
    return DTYPES[code]
