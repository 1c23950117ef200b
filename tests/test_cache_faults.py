"""nvrtc_cache under attack and under faults: untrusted directories and entries,
writers killed mid-write, full or read-only disks, many cold processes at once.

CPU only (NVRTC needs no GPU). Runs as root and as an ordinary user: where a case
needs another uid, root uses a real one (65534) and others fake os.geteuid.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nvrtc_cache
from nvrtc_cache import Cache, _entry, _store, _trust

try:
    import fcntl
except ImportError:
    fcntl = None

REPO = Path(nvrtc_cache.__file__).parents[1]
ELF = b"\x7fELF"
NOBODY = 65534
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
posix_only = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")


def kernel(i: int = 0) -> str:
    return f'extern "C" __global__ void k(float* x) {{ x[threadIdx.x] += {i}; }}\n'


def compile_(cache: Cache, i: int = 0, arch: str = "sm_80"):
    return cache.compile(kernel(i), arch=arch)


class Recorder:
    """Every RuntimeWarning raised inside the block (none filtered as duplicate)."""

    def __enter__(self):
        self._ctx = warnings.catch_warnings(record=True)
        self._caught = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)

    @property
    def messages(self) -> list[str]:
        return [str(w.message) for w in self._caught if issubclass(w.category, RuntimeWarning)]


def names(directory) -> list[str]:
    return sorted(os.listdir(directory))


def entry_names(directory) -> list[str]:
    return [n for n in names(directory) if n.endswith(".cubin-entry")]


def run_python(code: str, *args, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs,
    )


@pytest.fixture(autouse=True)
def _private_default_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(tmp_path / "default-cache"))


@pytest.fixture
def planted(tmp_path):
    """A cache directory holding one valid entry (for kernel(0), sm_80)."""
    directory = tmp_path / "cache"
    res = compile_(Cache(directory))
    return directory, res


def as_other_user(path: Path, monkeypatch) -> None:
    """Make ``path`` belong to another user: really (root), or by faking our euid."""
    if IS_ROOT:
        os.chown(path, NOBODY, NOBODY)
    else:
        fake = os.geteuid() + 1
        monkeypatch.setattr(os, "geteuid", lambda: fake)


# --- trust: the rules ---------------------------------------------------------------


def fake_stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, uid, 0, 0, 0, 0))


@posix_only
@pytest.mark.parametrize(
    "mode, uid, directory, verdict",
    [
        (stat.S_IFDIR | 0o700, 1000, True, None),
        (stat.S_IFDIR | 0o755, 1000, True, None),
        (stat.S_IFDIR | 0o755, 0, True, None),  # root's: root can do anything anyway
        (stat.S_IFDIR | 0o700, 1001, True, "another user"),
        (stat.S_IFDIR | 0o770, 1000, True, "writable by other users"),
        (stat.S_IFDIR | 0o757, 1000, True, "writable by other users"),
        (stat.S_IFDIR | 0o1777, 0, True, "writable by other users"),  # /tmp
        (stat.S_IFREG | 0o700, 1000, True, "not a directory"),
        (stat.S_IFREG | 0o600, 1000, False, None),
        (stat.S_IFREG | 0o644, 0, False, None),
        (stat.S_IFREG | 0o600, 1001, False, "another user"),
        (stat.S_IFREG | 0o620, 1000, False, "writable by other users"),
        (stat.S_IFREG | 0o602, 1000, False, "writable by other users"),
        (stat.S_IFLNK | 0o777, 1000, False, "not a regular file"),
        (stat.S_IFIFO | 0o600, 1000, False, "not a regular file"),
        (stat.S_IFDIR | 0o700, 1000, False, "not a regular file"),
    ],
)
def test_trust_rules(monkeypatch, mode, uid, directory, verdict):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    problem = _trust.problem(fake_stat(mode, uid), directory=directory)
    if verdict is None:
        assert problem is None
    else:
        assert verdict in problem and f"{stat.S_IMODE(mode):04o}" in problem and str(uid) in problem


def test_without_posix_owners_only_the_file_type_is_checked(monkeypatch, tmp_path):
    # Windows has no geteuid and no meaningful group/other bits: skip those checks.
    monkeypatch.delattr(os, "geteuid", raising=False)
    assert _trust.problem(fake_stat(stat.S_IFREG | 0o666, 4242), directory=False) is None
    assert _trust.problem(fake_stat(stat.S_IFDIR | 0o777, 4242), directory=True) is None
    assert "not a regular file" in _trust.problem(fake_stat(stat.S_IFIFO | 0o600, 0), directory=False)
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    directory.chmod(0o777)
    with Recorder() as rec:
        first = compile_(Cache(directory))
        again = compile_(Cache(directory))
    assert rec.messages == []
    assert (first.source, again.source) == ("compiled", "disk")


# --- trust: the directory ------------------------------------------------------------


@posix_only
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722, 0o1777])
def test_directory_others_can_write_is_never_read_or_written(planted, mode):
    directory, good = planted
    directory.chmod(mode)
    before = {n: (directory / n).read_bytes() for n in names(directory)}

    cache = Cache(directory)
    with Recorder() as rec:
        first = compile_(cache)  # its valid entry is on disk, but must not be loaded
        other = compile_(cache, 1)  # and nothing may be written
        assert cache.load(good.key) is None
    assert first.source == other.source == "compiled" and cache.nvrtc_compiles == 2
    assert first.cubin == good.cubin
    assert {n: (directory / n).read_bytes() for n in names(directory)} == before

    (message,) = rec.messages  # exactly one warning for this Cache
    assert repr(str(directory)) in message
    assert f"mode {mode:04o}" in message and f"owner uid {os.geteuid()}" in message
    assert "chmod 700" in message and "CUDATTN_CACHE_DIR" in message
    info = cache.info()
    assert info["trusted"] is False and info["writable"] is False
    directory.chmod(0o700)


@posix_only
def test_directory_of_another_user_is_never_read(planted, monkeypatch):
    directory, good = planted
    as_other_user(directory, monkeypatch)
    cache = Cache(directory)
    with Recorder() as rec:
        res = compile_(cache)
    assert res.source == "compiled" and cache.nvrtc_compiles == 1
    (message,) = rec.messages
    assert "another user" in message and repr(str(directory)) in message
    assert "CUDATTN_CACHE_DIR" in message and "chmod" not in message  # chmod would not help
    assert entry_names(directory) == [f"{good.key}.cubin-entry"]  # nothing added


@posix_only
def test_symlinked_directory_is_judged_by_its_target(tmp_path):
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o700)
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "to-private").symlink_to(private)
    (tmp_path / "to-shared").symlink_to(shared)
    with Recorder() as rec:
        assert compile_(Cache(tmp_path / "to-private")).source == "compiled"
        assert compile_(Cache(tmp_path / "to-private")).source == "disk"
    assert rec.messages == []
    with Recorder() as rec:
        compile_(Cache(tmp_path / "to-shared"))
    assert len(rec.messages) == 1 and names(shared) == []


# --- trust: entries ------------------------------------------------------------------


def _symlink(path: Path, monkeypatch, tmp_path):
    # The attacker's file is a perfectly valid entry; only the link gives it away.
    outside = tmp_path / "attacker-entry"
    shutil.copyfile(path, outside)
    path.unlink()
    path.symlink_to(outside)
    return outside


def _group_writable(path: Path, monkeypatch, tmp_path):
    path.chmod(0o660)


def _world_writable(path: Path, monkeypatch, tmp_path):
    path.chmod(0o606)


def _fifo(path: Path, monkeypatch, tmp_path):
    path.unlink()
    os.mkfifo(path)  # opening it for reading must not block


def _other_owner(path: Path, monkeypatch, tmp_path):
    if not IS_ROOT:
        pytest.skip("needs root to give a file away (the rule itself: test_trust_rules)")
    os.chown(path, NOBODY, NOBODY)


@posix_only
@pytest.mark.parametrize(
    "tamper",
    [_symlink, _group_writable, _world_writable, _fifo, _other_owner],
    ids=lambda f: f.__name__.lstrip("_"),
)
def test_untrusted_entry_is_a_miss_and_is_replaced(planted, tamper, monkeypatch, tmp_path):
    directory, good = planted
    path = directory / f"{good.key}.cubin-entry"
    attacker_file = tamper(path, monkeypatch, tmp_path)
    attacker_bytes = attacker_file.read_bytes() if attacker_file else None

    cache = Cache(directory)
    with Recorder() as rec:
        assert cache.load(good.key) is None
        res = compile_(cache)
        assert compile_(Cache(directory), 1).source == "compiled"  # the directory stays in use
    assert res.source == "compiled" and res.cubin == good.cubin
    (message,) = rec.messages  # one warning although load() and compile() both met it
    assert repr(str(path)) in message and "recompiling" in message

    st_ = path.lstat()  # replaced atomically by a private regular file
    assert stat.S_ISREG(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o600
    assert st_.st_uid == os.geteuid()
    if attacker_file:
        assert attacker_file.read_bytes() == attacker_bytes  # not written through the link
    with Recorder() as rec:
        healed = Cache(directory)
        assert compile_(healed).source == "disk" and healed.nvrtc_compiles == 0
    assert rec.messages == []


# --- verification of entries ------------------------------------------------------------


def test_entry_for_another_arch_is_a_miss(planted):
    directory, good = planted
    sm89 = compile_(Cache(directory.parent / "other"), arch="sm_89")
    forged = _entry.Entry(key=good.key, arch="sm_89", cubin=sm89.cubin, log="", lowered_names={})
    path = directory / f"{good.key}.cubin-entry"
    path.write_bytes(_entry.encode(forged))  # right key and checksum, wrong arch
    cache = Cache(directory)
    res = compile_(cache)
    assert res.source == "compiled" and res.arch == "sm_80" and res.cubin == good.cubin
    assert _entry.decode(path.read_bytes(), good.key, "sm_80").cubin == good.cubin


def test_entry_with_checksummed_empty_payload_is_a_miss(planted):
    # A header whose checksum matches an empty payload used to escape as struct.error.
    directory, good = planted
    header = _entry._HEADER.pack(_entry.MAGIC, _entry.ENTRY_FORMAT, 0, hashlib.sha256(b"").digest())
    (directory / f"{good.key}.cubin-entry").write_bytes(header)
    assert compile_(Cache(directory)).source == "compiled"


_FAKE = _entry.Entry(
    key="ab" * 32, arch="sm_90a", cubin=ELF + bytes(range(256)) * 4, log="ptxas info", lowered_names={"f": "_Z1fv"}
)
_BLOB = _entry.encode(_FAKE)


@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(0, len(_BLOB)),
    flips=st.lists(st.tuples(st.integers(0, len(_BLOB) - 1), st.integers(1, 255)), max_size=3),
)
def test_damaged_blob_never_decodes_to_something_else(cut, flips):
    blob = bytearray(_BLOB)
    for index, xor in flips:
        blob[index] ^= xor
    blob = bytes(blob[:cut])
    try:
        decoded = _entry.decode(blob, _FAKE.key, _FAKE.arch)
    except ValueError:
        return
    assert decoded == _FAKE and blob == _BLOB


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
