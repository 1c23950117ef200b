"""CPU: every backward build (each dtype, head-dim width, causal or not, softcap and ALiBi) compiles
for sm_80, sm_89 and sm_90a without register spills or stack, within the target's shared memory,
with the instructions it was written for (mma.sync m16n8k16, ldmatrix, cp.async) in its main
kernel; and the ctypes `BwdParams` matches the header field for field."""

from __future__ import annotations

import ctypes
import re

import pytest

from cudattn._kernels import backward_traits as _bt
from cudattn._kernels import registry as _kernels
from cudattn._kernels import traits as _traits
from cudattn._kernels.params import BwdParams, FwdParams
import _sass as _sass_mod

ARCHS = ("sm_80", "sm_89", "sm_90a")


@pytest.fixture(scope="module")
def cache(kernel_cache):
    return kernel_cache


def _builds():
    return [pytest.param(arch, k, id=f"{arch}-{k.describe().replace(' ', '-')}")
            for arch in ARCHS for k in _bt.all_backward_kernels(arch)]


@pytest.mark.parametrize("arch,kern", _builds())
def test_backward_build_has_no_spills(cache, arch, kern):
    res = _kernels.compile_variant(kern, arch, cache=cache)
    assert kern.smem_bytes <= _traits.ARCH_SMEM_LIMIT[arch]
    for entry in _bt.ENTRIES:
        rep = res.ptxas.get(entry)
        assert rep is not None, f"{entry} missing from {kern.describe()} on {arch}"
        assert rep.spill_stores == 0 and rep.spill_loads == 0 and rep.stack_bytes == 0, \
            f"{kern.describe()} {entry} spills on {arch}: {rep}"


@pytest.mark.parametrize("arch", ARCHS)
def test_backward_sass_uses_tensor_cores(cache, arch, tmp_path):
    kern = _bt.select_backward("bfloat16", 128, True, _traits.ARCH_SMEM_LIMIT[arch])
    sass = _sass_mod.sass(_kernels.compile_variant(kern, arch, cache=cache).cubin, tmp_path)
    main = sass[sass.index("flash_bwd_sm80"):]
    assert "HMMA.16816.F32.BF16" in main and "LDSM" in main and "LDGSTS" in main


def _header_fields(text: str, struct: str) -> list[str]:
    """Field names of a C struct, in order (``int a, b;`` declares two)."""
    body = re.sub(r"//[^\n]*", "", re.search(r"struct " + struct + r" \{(.*?)\n\};", text, re.S).group(1))
    names = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        first, *rest = (d.strip() for d in decl.split(","))
        names += [re.split(r"[\s*]+", first)[-1], *rest]
    return names


def test_bwd_params_mirror_the_header():
    text = (_kernels.source_root() / "include" / "cudattn" / "bwd" / "params.cuh").read_text()
    assert _header_fields(text, "BwdParams") == [f[0] for f in BwdParams._fields_]
    # by value: the forward's struct first, then 8-byte pointers and strides, ints last
    assert BwdParams.f.offset == 0 and BwdParams.dout.offset == ctypes.sizeof(FwdParams)
    assert ctypes.sizeof(BwdParams) % 8 == 0
