"""CPU: the maintainers' timeline probe (tools/kernel_timeline.py) still applies to the kernel sources,
and its build compiles for sm_90a with its stamps' globals and without spilling (spills would move the
times it measures). Run from a checkout: the tool is not part of the installed package."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import pytest

from cudattn._kernels import registry, traits

TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "kernel_timeline.py"


def _tool():
    if not TOOL.exists():
        pytest.skip("no checkout's tools/ beside these tests")
    if shutil.which("patch") is None:
        pytest.skip("no patch program")
    spec = importlib.util.spec_from_file_location("kernel_timeline", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.compile
@pytest.mark.parametrize("seqlen_q,two_ctas", [(512, False), (1024, True)], ids=["192-row-tiles", "two-ctas"])
def test_probe_applies_and_compiles_without_spills(tmp_path, monkeypatch, seqlen_q, two_ctas):
    tool = _tool()
    folder = tool.probe_sources(tmp_path)
    assert (folder / "include" / "cudattn" / "sm90" / "probe.cuh").exists()
    registry.sources.cache_clear()
    monkeypatch.setattr(registry, "source_root", lambda: folder)
    try:
        variant = traits.select("bfloat16", 64, True, traits.ARCH_SMEM_LIMIT["sm_90a"], "sm90", seqlen_q=seqlen_q,
                                two_ctas=two_ctas)
        assert variant.tiles.min_blocks == (2 if two_ctas else 1)
        res = registry.compile_variant(variant, "sm_90a")
    finally:
        registry.sources.cache_clear()
    report = res.ptxas[variant.kernel_name]
    assert b"cudattn_tl" in res.cubin and b"cudattn_tl_cta" in res.cubin
    assert report.spill_stores == 0 and report.spill_loads == 0, report


def test_probe_stamps_as_many_tiles_as_asked(tmp_path):
    """`--tiles`: fewer stamps a CTA, for builds whose shared memory leaves no room for 32 tiles' worth."""
    tool = _tool()
    folder = tool.probe_sources(tmp_path, tiles=6)
    probe = (folder / "include" / "cudattn" / "sm90" / "probe.cuh").read_text()
    assert "#define TL_TILES 6\n" in probe and f"#define TL_TILES {tool.TILES}\n" not in probe
