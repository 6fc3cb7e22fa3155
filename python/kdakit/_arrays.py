"""Array-library plumbing shared by the public functions: which library an argument comes from
(numpy or torch), where it lives, allocation of outputs in the same library and on the same
device, the CUDA stream to launch on, and the checks the C++ side cannot see (library mix,
``requires_grad``). No math happens here."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _torch():
    """torch if it is already imported (never imports it: numpy users do not pay for it)."""
    return sys.modules.get("torch")


def _is_torch_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


class ArrayKind:
    """The array library and device of one call, fixed by its first array argument."""

    def __init__(self, library: str, device: Any, first_name: str):
        self.library = library  # "numpy" or "torch"
        self.device = device  # torch.device for torch, "cpu" for numpy
        self.first_name = first_name

    @property
    def is_cuda(self) -> bool:
        return self.library == "torch" and self.device.type == "cuda"

    def __repr__(self) -> str:
        return f"ArrayKind({self.library}, {self.device})"


def classify(named: dict[str, Any]) -> ArrayKind:
    """Checks that every non-None argument in ``named`` is an array of one library on one
    device and returns that ArrayKind. Raises TypeError naming the first argument that is not
    an array or that differs, and NotImplementedError (a RuntimeError) for torch tensors that
    require gradients."""
    kind: ArrayKind | None = None
    for name, x in named.items():
        if x is None:
            continue
        if _is_torch_tensor(x):
            if x.requires_grad:
                raise NotImplementedError(
                    f"{name}: requires_grad=True, but training is not supported yet "
                    "(kdakit runs inference only); pass a tensor without gradients, e.g. "
                    "under torch.inference_mode() or with .detach()"
                )
            this = ArrayKind("torch", x.device, name)
        elif isinstance(x, np.ndarray):
            this = ArrayKind("numpy", "cpu", name)
        else:
            raise TypeError(
                f"{name}: expected a numpy.ndarray or torch.Tensor, got {type(x).__name__}"
            )
        if kind is None:
            kind = this
        elif this.library != kind.library:
            raise TypeError(
                f"{name}: expected a {kind.library} array like {kind.first_name}, "
                f"got a {this.library} array"
            )
        elif this.library == "torch" and this.device != kind.device:
            raise TypeError(
                f"{name}: expected device {kind.device} (the device of {kind.first_name}), "
                f"got {this.device}"
            )
    if kind is None:
        raise TypeError("expected array arguments, got none")
    return kind


_NUMPY_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "int64": np.int64,
}


def _torch_dtype(name: str):
    torch = _torch()
    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "int32": torch.int32,
        "int64": torch.int64,
        "uint8": torch.uint8,
    }[name]


def dtype_name(x: Any) -> str:
    """'float32', 'bfloat16', ... for a numpy array or torch tensor."""
    if _is_torch_tensor(x):
        return str(x.dtype).replace("torch.", "")
    return np.dtype(x.dtype).name


def empty(kind: ArrayKind, shape: tuple[int, ...], dtype: str):
    """An uninitialised array of ``kind``'s library and device."""
    if kind.library == "torch":
        return _torch().empty(shape, dtype=_torch_dtype(dtype), device=kind.device)
    if dtype == "uint8":
        return np.empty(shape, dtype=np.uint8)
    if dtype not in _NUMPY_DTYPES:
        raise TypeError(f"numpy has no {dtype} dtype; pass torch tensors for {dtype}")
    return np.empty(shape, dtype=_NUMPY_DTYPES[dtype])


def zeros(kind: ArrayKind, shape: tuple[int, ...], dtype: str):
    """A zero-filled array of ``kind``'s library and device."""
    if kind.library == "torch":
        return _torch().zeros(shape, dtype=_torch_dtype(dtype), device=kind.device)
    if dtype not in _NUMPY_DTYPES:
        raise TypeError(f"numpy has no {dtype} dtype; pass torch tensors for {dtype}")
    return np.zeros(shape, dtype=_NUMPY_DTYPES[dtype])


def arange_int32(kind: ArrayKind, n: int):
    """[0, 1, ..., n-1] as int32 in ``kind``'s library and device."""
    if kind.library == "torch":
        return _torch().arange(n, dtype=_torch().int32, device=kind.device)
    return np.arange(n, dtype=np.int32)


def copy_into(dst: Any, src: Any) -> None:
    """dst[...] = src (same library); converts the dtype like an assignment would."""
    if _is_torch_tensor(dst):
        dst.copy_(src)
    else:
        np.copyto(dst, src, casting="unsafe")


def to_host_list(x: Any) -> list[int]:
    """The values of a small 1-D integer array as Python ints (a device-to-host copy for CUDA
    tensors, i.e. a synchronisation)."""
    if _is_torch_tensor(x):
        return [int(v) for v in x.tolist()]
    return [int(v) for v in np.asarray(x).tolist()]


def current_stream(kind: ArrayKind) -> int:
    """The cudaStream_t (as int) torch launches on for ``kind``'s device; 0 on the CPU."""
    if not kind.is_cuda:
        return 0
    return _torch().cuda.current_stream(kind.device).cuda_stream


def stream_handle(kind: ArrayKind, stream: Any) -> int:
    """The cudaStream_t (as int) of a ``stream`` argument: the current torch stream when None,
    else a torch.cuda.Stream's handle or the int itself. ValueError for a stream on the CPU."""
    if stream is None:
        return current_stream(kind)
    if not kind.is_cuda:
        raise ValueError("stream: only meaningful for CUDA tensors; the arrays are on the CPU")
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise TypeError(
            f"stream: expected a torch.cuda.Stream or a cudaStream_t as int, got {type(stream).__name__}"
        )
    return handle


class _NullGuard:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def device_guard(kind: ArrayKind):
    """A context that makes ``kind``'s CUDA device current while a kernel is launched (the
    kernels launch on the current device); a no-op when it already is, and on the CPU."""
    if not kind.is_cuda:
        return _NullGuard()
    torch = _torch()
    index = kind.device.index
    if index is None or index == torch.cuda.current_device():
        return _NullGuard()
    return torch.cuda.device(index)
