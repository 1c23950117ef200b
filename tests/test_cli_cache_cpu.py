"""`cudattn cache info|clear --arch`: only that target's entries are counted or removed (an entry's
metadata names its arch), and `writable: False` says why (refused for safety, a file in the way,
no permission). Entries are written directly, so nothing compiles."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import nvrtc_cache
from nvrtc_cache import _entry, _store


def _fill(directory, archs):
    cache = nvrtc_cache.Cache(directory)
    for i, arch in enumerate(archs):
        cache._store.save(_entry.Entry(key=f"{i:064x}", arch=arch, cubin=b"\x7fELF" + bytes(1000 * (i + 1)), log="",
                                       lowered_names={}))
    return cache


def _cli(directory, *argv):
    res = subprocess.run([sys.executable, "-m", "cudattn", "cache", *argv], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, CUDATTN_CACHE_DIR=str(directory)))
    assert res.returncode == 0 and res.stderr == "", res
    return res.stdout


def test_info_and_clear_by_arch(tmp_path):
    cache = _fill(tmp_path, ["sm_80", "sm_89", "sm_89", "sm_90a"])
    (tmp_path / ("f" * 64 + ".cubin-entry")).write_bytes(b"garbage")  # unreadable: no arch, never matched
    sizes = sum((tmp_path / f"{i:064x}.cubin-entry").stat().st_size for i in (1, 2))
    assert cache.info("sm_89")["entries"] == 2 and cache.info("sm_89")["total_bytes"] == sizes
    assert cache.info()["entries"] == 5 and cache.info("sm_86")["entries"] == 0
    assert [e.key for e in cache.entries("sm_90a")] == [f"{3:064x}"]
    assert cache.clear("sm_89") == 2
    assert sorted(e.key for e in cache.entries()) == [f"{0:064x}", f"{3:064x}", "f" * 64]
    assert cache.clear() == 3 and list(cache.entries()) == []


def test_cli_info_and_clear_honour_arch(tmp_path):
    _fill(tmp_path, ["sm_80", "sm_89", "sm_89"])
    text = _cli(tmp_path, "info", "--arch", "sm_89")
    assert "entries for sm_89: 2\n" in text and "size for sm_89: " in text and "writable: True\n" in text
    assert _cli(tmp_path, "clear", "--arch", "sm_89") == f"removed 2 sm_89 entries from {tmp_path}\n"
    assert "entries: 1\n" in _cli(tmp_path, "info")
    assert _cli(tmp_path, "clear") == f"removed 1 entries from {tmp_path}\n"


def test_writable_false_says_why(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (tmp_path / "file").write_text("")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    cases = {shared: "refused for safety: it is writable by other users",
             tmp_path / "file": "it exists and is not a directory",
             tmp_path / "file" / "cache": "cannot be created: ",
             tmp_path / "new" / "cache": None}
    for directory, why in cases.items():
        info = nvrtc_cache.Cache(directory).info()
        assert info["writable"] is (why is None) and (info["why_not_writable"] or "").startswith(why or ""), info
        line = [x for x in _cli(directory, "info").splitlines() if x.startswith("writable: ")]
        assert line == ([f"writable: False ({info['why_not_writable']})"] if why else ["writable: True"])
    assert "chmod 700" in nvrtc_cache.Cache(shared).info()["why_not_writable"]
    monkeypatch.setattr(_store.os, "access", lambda path, mode: False)  # as a user without permission
    assert nvrtc_cache.Cache(private).info()["why_not_writable"].startswith("no write permission")
    assert "cannot be created in " in nvrtc_cache.Cache(private / "sub").info()["why_not_writable"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_directory_says_no_permission(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    assert "writable: False (no write permission" in _cli(ro, "info")
