"""The Python examples of docs/serving.md run as written: every ```python block, in order, in
one namespace (a block whose first line is ``# example: cuda only`` only where the GPU path
can run). Skipped without torch, which the examples use."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from kdakit.testing import cuda_available

pytest.importorskip("torch")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)


def test_the_guide_has_examples():
    assert len(_blocks()) >= 4


def test_serving_guide_examples_run(monkeypatch):
    # NOTE: a real module in sys.modules: torch.compile (dynamo) imports the globals' module by
    # name, which a bare dict namespace does not have (torch 2.11 raised ModuleNotFoundError).
    module = types.ModuleType("serving_guide")
    monkeypatch.setitem(sys.modules, "serving_guide", module)
    namespace = module.__dict__
    on_gpu = cuda_available()[0]
    ran = 0
    for i, block in enumerate(_blocks()):
        if block.startswith("# example: cuda only") and not on_gpu:
            continue
        exec(compile(block, f"{GUIDE.name} python block {i}", "exec"), namespace)
        ran += 1
    assert ran >= (4 if on_gpu else 3), "blocks that run everywhere: 3, on a GPU one more"
