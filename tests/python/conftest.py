"""Shared pytest setup for tests/python.

GPU tests (tests/python/test_gpu_*.py) mark themselves ``@pytest.mark.requires_cuda`` or take
the ``cuda`` fixture: both skip cleanly, with the reason, when torch, a CUDA device or a CUDA
build of kdakit is missing. Tests that need torch but no GPU take the ``torch`` fixture."""

from __future__ import annotations

import pytest

import kdakit
from kdakit.testing import cuda_available


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "requires_cuda: needs torch with a CUDA device and a CUDA build of kdakit (else skipped)",
    )


def pytest_runtest_setup(item):
    if item.get_closest_marker("requires_cuda") is not None:
        ok, reason = cuda_available()
        if not ok:
            pytest.skip(f"requires CUDA: {reason}")


@pytest.fixture
def cuda():
    """torch.device('cuda') when the GPU path can run; skips otherwise."""
    ok, reason = cuda_available()
    if not ok:
        pytest.skip(f"requires CUDA: {reason}")
    import torch

    return torch.device("cuda")


@pytest.fixture
def torch():
    """The torch module; skips when torch is not importable."""
    return pytest.importorskip("torch")


def pytest_report_header(config):
    ok, reason = cuda_available()
    return [f"kdakit {kdakit.__version__} from {kdakit.__file__}; "
            f"built_with_cuda={kdakit.built_with_cuda()}; GPU tests: {'on' if ok else 'skipped (' + reason + ')'}"]
