"""GPU: the README's Python examples run as written, in order, in one namespace (they build on each
other), and give what their comments say."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.skipif(not README.is_file(), reason="no README beside the tests (an installed copy)")
def test_the_readme_examples_run(torch):
    blocks = _blocks()
    assert len(blocks) >= 3, "the README's NumPy, device and decode examples"
    ns: dict = {}
    exec(compile(blocks[0], "README block 1", "exec"), ns)  # NumPy in, NumPy out
    assert isinstance(ns["out"], np.ndarray) and ns["out"].shape == (2, 1024, 16, 128)
    assert ns["lse"].shape == (2, 16, 1024) and np.isfinite(ns["lse"]).all()
    exec(compile(blocks[1], "README block 2", "exec"), ns)  # torch in, torch back through DLPack
    assert isinstance(ns["o"], torch.Tensor) and tuple(ns["o"].shape) == (2, 16, 1024, 128)
    for i, block in enumerate(blocks[2:], start=3):
        exec(compile(block, f"README block {i}", "exec"), ns)
    torch.cuda.synchronize()
    out = torch.from_dlpack(ns["out"])
    assert tuple(out.shape) == (8, 1, 32, 128) and torch.isfinite(out).all()
    # the appended keys landed at position 1000 of every sequence
    assert torch.equal(ns["k_cache"][:, 1000], ns["k1"][:, 0]) and torch.equal(ns["v_cache"][:, 1000], ns["v1"][:, 0])
