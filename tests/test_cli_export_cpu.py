"""`cudattn export` into a directory: --out is checked before anything compiles (exit status 2, one
line naming --out), and exports into one directory add up (one manifest listing every target there,
the C table agreeing with it, nothing left on disk that no manifest lists). A few small kernels
stand in for the catalogue, so that this runs in seconds."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time

import pytest

import nvrtc_cache
from cudattn._kernels import catalog as _catalog
from cudattn._tools import cli as _cli
from cudattn._tools import export as _export
from cudattn._tools import warm as _warm


@pytest.fixture
def few(monkeypatch, tmp_path):
    """Two small kernels per target (three for sm_90a, to change a target's set), a table row each,
    and a private cache (also the default one, for the CLI)."""
    helpers = {}

    def all_kernels(arch, distributed=False):  # warm asks for the ring's too; the export does not
        if arch not in helpers:
            helpers[arch] = [s for s in _real_all_kernels(arch) if s.family == "helper"][:3 if arch == "sm_90a" else 2]
        return helpers[arch]

    monkeypatch.setattr(_catalog, "all_kernels", all_kernels)
    monkeypatch.setattr(_export, "_selection_table", lambda arch, files: [{"kind": "append", "file": f}
                                                                           for f in files.values()])
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(tmp_path / "cache"))
    return helpers, nvrtc_cache.Cache(tmp_path / "cache")


_real_all_kernels = _catalog.all_kernels


def _listed(manifest):
    return {f"{arch}/{k['file']}" for arch, e in manifest["archs"].items() for k in e["kernels"]}


def _on_disk(out):
    return {f"{p.parent.name}/{p.name}" for p in out.glob("*/*.cubin")}


def _agrees(out, manifest):
    """The manifest on disk, its id, the files and the C table are one export."""
    assert json.loads((out / "manifest.json").read_text()) == json.loads(json.dumps(manifest))
    assert _export.read_manifest(out)["id"] == manifest["id"]
    digest = hashlib.sha256()
    for arch, entry in manifest["archs"].items():
        for k in entry["kernels"]:
            digest.update(f"{arch}/{k['file']}:{k['sha256']}\n".encode())
            assert hashlib.sha256((out / arch / k["file"]).read_bytes()).hexdigest() == k["sha256"]
    assert manifest["id"] == digest.hexdigest()[:32]
    assert _on_disk(out) == _listed(manifest)
    table = (out / "include" / "cudattn_kernels.h").read_text()
    assert f'#define CUDATTN_EXPORT_ID "{manifest["id"]}"' in table
    rows = re.findall(r'^    \{"(sm_\w+)", .*?"(sm_\w+/[\w.]+\.cubin)"', table, re.M)
    assert sorted(f for _, f in rows) == sorted(f"{a}/{r['file']}" for a, e in manifest["archs"].items()
                                                for r in e["selection"])


def test_exports_into_one_directory_add_up(few, tmp_path):
    helpers, cache = few
    out = tmp_path / "x"
    first = _export.export(out, ["sm_90a"], cache=cache, progress=False)
    second = _export.export(out, ["sm_89"], cache=cache, progress=False)
    assert list(second["archs"]) == ["sm_89", "sm_90a"]  # every target there, in one order
    assert second["archs"]["sm_90a"] == first["archs"]["sm_90a"] and second["id"] != first["id"]
    _agrees(out, second)
    # the same target again, with one kernel fewer: its old file goes, the other target stays
    helpers["sm_90a"] = helpers["sm_90a"][:2]
    third = _export.export(out, ["sm_90a", "sm_89"], cache=cache, progress=False)
    assert list(third["archs"]) == ["sm_89", "sm_90a"] and len(third["archs"]["sm_90a"]["kernels"]) == 2
    _agrees(out, third)


def test_the_cli_takes_several_targets_and_says_which_were_kept(few, tmp_path, capsys):
    out = tmp_path / "x"
    assert _cli.main(["export", "--arch", "sm_80", "--arch", "sm_89", "--out", str(out), "--jobs", "1"]) == 0
    assert _cli.main(["export", "--arch", "sm_90a", "--arch", "sm_80", "--out", str(out), "--jobs", "1"]) == 0
    text = capsys.readouterr().out.splitlines()
    manifest = _export.read_manifest(out)
    assert list(manifest["archs"]) == ["sm_80", "sm_89", "sm_90a"]
    _agrees(out, manifest)
    last = [line.split(":")[0] + (" kept" if "kept from an earlier export" in line else "")
            for line in text[-5:-2]]
    assert last == ["sm_80", "sm_89 kept", "sm_90a"]
    assert "--print-cflags --out" in text[-1] and "-ldl -lm" in text[-1]


@pytest.mark.parametrize("change", [{"cudattn": "0.0.1"}, {"commit": "another"}, {"format": 999}, "not json"])
def test_an_earlier_export_of_another_build_is_dropped_with_a_note(few, tmp_path, capsys, change):
    _, cache = few
    out = tmp_path / "x"
    _export.export(out, ["sm_86"], cache=cache, progress=False)
    (out / "sm_86" / "mine.txt").write_text("not the export's")
    path = out / "manifest.json"
    path.write_text(change if isinstance(change, str) else json.dumps({**json.loads(path.read_text()), **change}))
    capsys.readouterr()
    manifest = _export.export(out, ["sm_80"], cache=cache, progress=False)
    assert list(manifest["archs"]) == ["sm_80"]
    err = capsys.readouterr().err
    if isinstance(change, str):  # unreadable: nothing known of it, nothing removed
        assert err == f"note: {path} is unreadable (Expecting value: line 1 column 1 (char 0)): it is replaced\n"
        assert len(list((out / "sm_86").glob("*.cubin"))) == 2
        return
    assert err.startswith("note: ") and "its sm_86 kernels are not kept" in err and "--arch sm_86" in err
    assert list(change)[0] in err
    _agrees(out, manifest)
    assert sorted(p.name for p in (out / "sm_86").iterdir()) == ["mine.txt"]


def test_an_earlier_target_whose_files_are_gone_is_dropped(few, tmp_path, capsys):
    _, cache = few
    out = tmp_path / "x"
    _export.export(out, ["sm_80", "sm_86"], cache=cache, progress=False)
    next((out / "sm_86").glob("*.cubin")).unlink()
    capsys.readouterr()
    manifest = _export.export(out, ["sm_89"], cache=cache, progress=False)
    assert list(manifest["archs"]) == ["sm_80", "sm_89"]
    assert capsys.readouterr().err == (f"note: {out} lacks files its manifest lists: its sm_86 kernels are not "
                                       "kept (export them again with --arch sm_86)\n")
    _agrees(out, manifest)


def _in_the_way(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "include").write_text("")
    (tmp_path / "man" / "manifest.json").mkdir(parents=True)
    cases = [(tmp_path / "file", "exists and is not a directory"),
             (tmp_path / "file" / "sub", "cannot be created"),
             (tmp_path / "inc", "is in the way"),
             (tmp_path / "man", "is a directory")]
    if os.path.isdir("/proc/self"):
        cases.append(("/proc/nope", "cannot be created"))
    return cases


def test_out_is_checked_before_anything_compiles(tmp_path, monkeypatch):
    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled before checking --out")

    monkeypatch.setattr(_warm, "warm", no_compiling)
    for out, why in _in_the_way(tmp_path):
        with pytest.raises(_export.OutDirError, match=why):
            _export.export(out, ["sm_80"])
    if os.geteuid() != 0:  # root may write anywhere
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(_export.OutDirError, match="not writable"):
            _export.export(tmp_path / "ro", ["sm_80"])


def test_cli_bad_out_is_status_2_and_one_line_naming_it(tmp_path):
    for out, why in _in_the_way(tmp_path):
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "cudattn", "export", "--arch", "sm_80", "--out", str(out)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and res.stdout == "", res
        (line,) = res.stderr.splitlines()
        assert line.startswith(f"python -m cudattn export: error: --out {out}") and why in line, line
        assert line.endswith("(see python -m cudattn export --help)")
        assert time.perf_counter() - t0 < 60  # nothing compiled (sm_80 takes minutes on 2 CPUs)
