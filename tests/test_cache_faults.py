"""nvrtc_cache under faults: writers and compilers killed at random moments, temp files left
behind or removed by a concurrent clear, directory fsyncs, and many cold processes compiling one
key at once. CPU only (NVRTC needs no GPU); runs as root and as an ordinary user.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nvrtc_cache import Cache, _entry, _store
from _cache_faults_cases import ELF, REPO, Recorder, compile_, entry_names, kernel, names, run_python
from _cache_faults_cases import _private_default_dir as _private_default_dir, planted as planted  # fixtures

try:
    import fcntl
except ImportError:
    fcntl = None


# --- writers killed mid-write -------------------------------------------------------------

_WRITER = """
import hashlib, os, sys
from pathlib import Path
import time
from nvrtc_cache import _entry, _store
real_write = _store._write_all

def slow_disk(fd, data):  # 64 chunks with pauses: most kills then land mid-write
    step = len(data) // 64 + 1
    for start in range(0, len(data), step):
        real_write(fd, data[start : start + step])
        time.sleep(0.0005)

_store._write_all = slow_disk
store, base = _store.DiskStore(Path(sys.argv[1])), os.urandom(1 << 20)
print("ready", flush=True)
generation = 0
while True:
    for i in range(3):
        key = hashlib.sha256(str(i).encode()).hexdigest()
        cubin = b"\\x7fELF" + key.encode() + generation.to_bytes(8, "little") + base
        store.save(_entry.Entry(key, "sm_80", cubin, f"generation {generation}", {}))
    generation += 1
"""

_CHECKER = """
import hashlib, json, sys, warnings
from nvrtc_cache import Cache
warnings.simplefilter("error")  # a healthy directory must not warn
cache = Cache(sys.argv[1])
out = {}
for i in range(3):
    key = hashlib.sha256(str(i).encode()).hexdigest()
    res = cache.load(key)
    out[key] = None if res is None else [res.cubin[:4 + 64].decode("latin-1"), res.arch, len(res.cubin)]
print(json.dumps(out))
"""


def _kill_at_random(code: str, args, rounds: int, max_delay: float, rng: random.Random) -> list[float]:
    delays = []
    for _ in range(rounds):
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            delays.append(rng.uniform(0, max_delay))
            time.sleep(delays[-1])
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL, child.stderr.read()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
    return delays


def _assert_entries_valid(directory, arch="sm_80") -> list[str]:
    keys = []
    for file_name in entry_names(directory):
        key = file_name.removesuffix(".cubin-entry")
        entry = _entry.decode((Path(directory) / file_name).read_bytes(), key, arch)  # raises if torn
        assert entry.cubin.startswith(ELF)
        keys.append(key)
    return keys


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_writer_killed_at_random_moments_leaves_no_torn_entry(tmp_path):
    directory = tmp_path / "cache"
    rng = random.Random()
    delays = _kill_at_random(_WRITER, [directory], rounds=8, max_delay=0.25, rng=rng)
    context = f"kill delays {delays}, files {names(directory)}"

    keys = _assert_entries_valid(directory)
    assert keys, context  # some writes completed
    checked = run_python(_CHECKER, directory)  # a fresh process, as a later user would be
    assert checked.returncode == 0, checked.stderr + context
    for key, loaded in json.loads(checked.stdout).items():
        if key in keys:
            prefix, arch, size = loaded
            assert prefix == "\x7fELF" + key and arch == "sm_80" and size == 4 + 64 + 8 + (1 << 20)
        else:
            assert loaded is None  # never written: a miss, not an error

    cache = Cache(directory)
    assert sorted(e.key for e in cache.entries()) == sorted(keys)  # temp files are not entries
    assert cache.clear() == len(keys)
    assert names(directory) == [], context  # abandoned temp files went too


_COMPILER = """
import sys, time
from nvrtc_cache import Cache, _nvrtc, _store, _sysinclude
real_write = _store._write_all

def slow_disk(fd, data):  # kills then land in the compile or in the write
    for start in range(0, len(data), 256):
        real_write(fd, data[start : start + 256])
        time.sleep(0.001)

_store._write_all = slow_disk
_nvrtc.nvrtc_version(), _sysinclude.fingerprint(_sysinclude.include_dir())  # warm up first
cache, round_ = Cache(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
for j in range(10_000):
    cache.compile('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= %d; }' % (round_ * 10_000 + j), arch="sm_80")
"""

_RECOMPILER = """
import json, sys, warnings
from nvrtc_cache import Cache
warnings.simplefilter("error")
cache, fresh = Cache(sys.argv[1]), Cache(sys.argv[2])
out = []
for round_ in range(int(sys.argv[3])):
    for j in range(3):
        src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= %d; }' % (round_ * 10_000 + j)
        res = cache.compile(src, arch="sm_80")
        out.append([res.source, res.cubin == fresh.compile(src, arch="sm_80").cubin])
print(json.dumps(out))
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_compiler_killed_at_random_moments_leaves_no_torn_entry(tmp_path):
    directory = tmp_path / "cache"
    rng, rounds = random.Random(), 3
    delays = []
    for round_ in range(rounds):
        delays += _kill_at_random(_COMPILER, [directory, round_], rounds=1, max_delay=0.3, rng=rng)
    context = f"kill delays {delays}, files {names(directory)}"
    _assert_entries_valid(directory)

    checked = run_python(_RECOMPILER, directory, tmp_path / "fresh", rounds)
    assert checked.returncode == 0, checked.stderr + context
    results = json.loads(checked.stdout)
    assert all(source in ("disk", "compiled") and same for source, same in results), results
    Cache(directory).clear()
    assert names(directory) == [], context


# --- temp files ------------------------------------------------------------------------------


@pytest.mark.skipif(fcntl is None, reason="liveness of temp files uses flock")
def test_clear_removes_abandoned_temp_files_but_not_a_live_writers(planted):
    directory, good = planted
    live, dead = directory / f".{good.key[:16]}-live.tmp", directory / f".{good.key[:16]}-dead.tmp"
    dead.write_bytes(b"half an entry")
    with open(live, "wb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # what DiskStore.save holds while writing
        cache = Cache(directory)
        assert [e.key for e in cache.entries()] == [good.key]
        assert cache.clear() == 1
        assert names(directory) == [live.name]
    assert Cache(directory).clear() == 0 and names(directory) == []


@pytest.mark.skipif(fcntl is None, reason="liveness of temp files uses flock")
def test_clear_during_a_write_leaves_the_writers_temp_file(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    real_write, cleared = _store._write_all, []

    def write_with_clear_in_the_middle(fd, data):
        real_write(fd, data[:100])
        cleared.append(Cache(directory).clear())  # another process running `cache clear`
        real_write(fd, data[100:])

    monkeypatch.setattr(_store, "_write_all", write_with_clear_in_the_middle)
    with Recorder() as rec:
        res = compile_(Cache(directory))
    assert cleared == [0] and rec.messages == []
    assert entry_names(directory) == [f"{res.key}.cubin-entry"] == names(directory)


def test_temp_removed_by_a_concurrent_clear_is_not_an_error(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    real_write = _store._write_all

    def write_then_clear(fd, data):
        real_write(fd, data)
        for file_name in names(directory):  # as clear() might, between write and replace
            os.unlink(directory / file_name)

    monkeypatch.setattr(_store, "_write_all", write_then_clear)
    cache = Cache(directory)
    with Recorder() as rec:
        assert compile_(cache).source == "compiled"
    assert rec.messages == [] and names(directory) == []
    monkeypatch.setattr(_store, "_write_all", real_write)
    compile_(cache, 1)
    assert len(entry_names(directory)) == 1  # the cache still writes to disk


def test_directory_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    real_fsync, synced = os.fsync, []

    def spy(fd):
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        synced.append("dir" if is_dir else "file")
        if is_dir:
            raise OSError(errno.EINVAL, "cannot fsync a directory here")  # best effort only
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    cache = Cache(tmp_path / "cache")
    with Recorder() as rec:
        compile_(cache)
    assert synced == ["file", "dir"] and rec.messages == []
    assert len(entry_names(cache.directory)) == 1


# --- many cold processes on one key ---------------------------------------------------------------


def _cold_worker(directory, barrier, results):
    try:
        import warnings as w

        from nvrtc_cache import Cache as C, _nvrtc, _sysinclude

        _nvrtc.nvrtc_version(), _sysinclude.fingerprint(_sysinclude.include_dir())
        cache = C(directory)
        barrier.wait(timeout=120)
        with w.catch_warnings(record=True) as caught:
            w.simplefilter("always")
            res = cache.compile(kernel(7), arch="sm_80")
        results.put(("ok", res.cubin, res.source, [str(x.message) for x in caught]))
    except BaseException as exc:  # report, don't hang the parent
        results.put(("error", repr(exc), "", []))


def test_eight_cold_processes_on_one_key(tmp_path):
    directory = tmp_path / "cold"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    workers = [ctx.Process(target=_cold_worker, args=(str(directory), barrier, results)) for _ in range(8)]
    for worker in workers:
        worker.start()
    try:
        outcomes = [results.get(timeout=180) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * 8
    assert all(status == "ok" and not caught for status, _, _, caught in outcomes), outcomes
    cubins = {cubin for _, cubin, _, _ in outcomes}
    assert len(cubins) == 1 and next(iter(cubins)).startswith(ELF)
    assert {source for _, _, source, _ in outcomes} <= {"compiled", "disk"}

    (file_name,) = names(directory)  # exactly one entry, no temp file
    key = file_name.removesuffix(".cubin-entry")
    assert _entry.decode((directory / file_name).read_bytes(), key, "sm_80").cubin in cubins
