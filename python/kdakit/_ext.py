"""Loads the compiled extension kdakit._kdakit on first use, with an error that says how to
build it when it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

_module: ModuleType | None = None


def ext() -> ModuleType:
    """The extension module kdakit._kdakit."""
    global _module
    if _module is None:
        try:
            _module = importlib.import_module("kdakit._kdakit")
        except ImportError as err:
            raise ImportError(
                "kdakit's compiled extension kdakit._kdakit is not importable "
                f"({err}). Install the package with `pip install .` from the repository root, "
                "or build the CMake project and put <build>/python on PYTHONPATH."
            ) from err
    return _module


def built_with_cuda() -> bool:
    """Whether the extension was built with the sm_90a CUDA kernels."""
    return bool(ext().built_with_cuda())
