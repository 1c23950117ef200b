"""The SASS of a cubin, for the tests that read it: ``cuobjdump -sass`` (which runs nvdisasm), from
NVIDIA's pip wheels (found through cuda.pathfinder), else from the PATH."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

MISSING = "cuobjdump/nvdisasm not installed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"


def tool(name: str) -> str | None:
    try:
        import cuda.pathfinder as pf

        return pf.find_nvidia_binary_utility(name) or shutil.which(name)
    except Exception:
        return shutil.which(name)


def sass_or_none(cubin: bytes, tmp_path) -> str | None:
    """The cubin's SASS, or None where cuobjdump is not installed."""
    cuobjdump, nvdisasm = tool("cuobjdump"), tool("nvdisasm")
    if cuobjdump is None:
        return None
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm)) if nvdisasm else None
    proc = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sass(cubin: bytes, tmp_path) -> str:
    """The cubin's SASS; the test is skipped where cuobjdump or nvdisasm is not installed."""
    if tool("cuobjdump") is None or tool("nvdisasm") is None:
        pytest.skip(MISSING)
    return sass_or_none(cubin, tmp_path)
