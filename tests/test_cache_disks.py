"""nvrtc_cache on full or read-only disks: injected write failures, a really full tmpfs and an
unprivileged user's read-only directory keep compiling, with one warning. CPU only (NVRTC needs
no GPU); runs as root and as an ordinary user.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from nvrtc_cache import Cache, _store
from _cache_faults_cases import ELF, IS_ROOT, NOBODY, Recorder, compile_, names, posix_only, run_python
from _cache_faults_cases import _private_default_dir as _private_default_dir  # fixtures


# --- full and read-only disks -------------------------------------------------------------------


def _fail(err: int):
    def raise_(*args, **kwargs):
        raise OSError(err, os.strerror(err))

    return raise_


def _inject_write(monkeypatch, err):
    real_write = _store._write_all

    def half_then_fail(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(_store, "_write_all", half_then_fail)


def _inject_create(monkeypatch, err):
    real_open = _store._Dir.open

    def open_(self, name, flags, mode=0o600):
        if flags & os.O_CREAT:
            raise OSError(err, os.strerror(err))
        return real_open(self, name, flags, mode)

    monkeypatch.setattr(_store._Dir, "open", open_)


def _inject_fsync(monkeypatch, err):
    monkeypatch.setattr(os, "fsync", _fail(err))


def _inject_replace(monkeypatch, err):
    monkeypatch.setattr(_store._Dir, "replace", _fail(err))


def _inject_mkdir(monkeypatch, err):
    monkeypatch.setattr(os, "mkdir", _fail(err))


@pytest.mark.parametrize(
    "inject, err",
    [
        (_inject_write, errno.ENOSPC),
        (_inject_write, errno.EDQUOT),
        (_inject_fsync, errno.EIO),
        (_inject_create, errno.EROFS),
        (_inject_create, errno.EACCES),
        (_inject_create, errno.ENOSPC),
        (_inject_replace, errno.EROFS),
        (_inject_mkdir, errno.EROFS),
    ],
    ids=lambda v: getattr(v, "__name__", None) and v.__name__.removeprefix("_inject_") or errno.errorcode[v],
)
def test_write_failure_keeps_compiling_with_one_warning(tmp_path, monkeypatch, inject, err):
    directory = tmp_path / "cache"
    if inject is not _inject_mkdir:
        directory.mkdir(mode=0o700)
    inject(monkeypatch, err)
    cache = Cache(directory)
    with Recorder() as rec:
        first, second = compile_(cache), compile_(cache, 1)
        assert compile_(cache).source == "memory"
    assert first.source == second.source == "compiled"
    assert first.cubin.startswith(ELF) and second.cubin.startswith(ELF)
    (message,) = rec.messages
    assert repr(str(directory)) in message and os.strerror(err) in message
    assert cache.info()["writable"] is False
    monkeypatch.undo()
    assert not directory.exists() or names(directory) == []  # no entry, no temp file left


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir(mode=0o700)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)],
            capture_output=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, timeout=10)


def test_really_full_disk(tiny_tmpfs):
    fd = os.open(tiny_tmpfs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    cache = Cache(tiny_tmpfs)
    with Recorder() as rec:
        first, second = compile_(cache), compile_(cache, 1)
    assert first.source == second.source == "compiled" and first.cubin.startswith(ELF)
    (message,) = rec.messages
    assert os.strerror(errno.ENOSPC) in message
    assert names(tiny_tmpfs) == ["filler"]  # the failed temp file was removed


_READ_ONLY = """
import json, os, sys, warnings
from nvrtc_cache import Cache, _nvrtc
Cache(sys.argv[2]).compile('__global__ void warm() {}', arch="sm_80")  # load NVRTC as root
try:
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
except OSError as exc:
    print(json.dumps({"skip": f"cannot drop privileges: {exc}"})); sys.exit()
try:  # NVRTC itself (no cache) must work as nobody, else this machine cannot run the check
    _nvrtc.run_nvrtc(b'__global__ void probe() {}', "probe.cu", (), ["-arch=sm_80"], ())
except Exception as exc:
    print(json.dumps({"skip": f"NVRTC does not work as uid 65534 here: {exc!r}"})); sys.exit()
cache = Cache(sys.argv[1])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sources = [cache.compile('__global__ void k%d() {}' % i, arch="sm_80").source for i in range(2)]
print(json.dumps({"uid": os.geteuid(), "sources": sources, "writable": cache.info()["writable"],
                  "warnings": [str(w.message) for w in caught]}))
"""


@posix_only
def test_read_only_directory_of_an_unprivileged_user(tmp_path):
    if not IS_ROOT:
        directory = tmp_path / "ro"
        directory.mkdir(mode=0o500)
        try:
            cache = Cache(directory)
            with Recorder() as rec:
                sources = [compile_(cache, i).source for i in range(2)]
            outcome = {"sources": sources, "writable": cache.info()["writable"], "warnings": rec.messages}
        finally:
            directory.chmod(0o700)
    else:
        # Root ignores permission bits, so the check runs in a child that becomes
        # nobody; the directory lies outside tmp_path (0700, root's) so nobody can reach it.
        parent = Path(tempfile.mkdtemp(prefix="nvrtc-ro-"))
        try:
            parent.chmod(0o711)
            directory = parent / "ro"
            directory.mkdir()
            os.chown(directory, NOBODY, NOBODY)
            directory.chmod(0o500)
            done = run_python(_READ_ONLY, directory, tmp_path / "warm")
            assert done.returncode == 0, done.stderr
            outcome = json.loads(done.stdout)
            if "skip" in outcome:
                pytest.skip(outcome["skip"])
            assert outcome["uid"] == NOBODY
        finally:
            shutil.rmtree(parent)
    assert outcome["sources"] == ["compiled", "compiled"] and outcome["writable"] is False
    (message,) = outcome["warnings"]
    assert "cannot write" in message and os.strerror(errno.EACCES) in message
