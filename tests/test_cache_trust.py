"""nvrtc_cache under attack: the trust rules, untrusted directories (others can write, another
user's, symlinked) and entries (links, modes, owners), and the verification of entries (another
arch, empty or damaged payloads). CPU only (NVRTC needs no GPU); runs as root and as an ordinary
user.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvrtc_cache import Cache, _entry, _trust
from _cache_faults_cases import ELF, IS_ROOT, NOBODY, Recorder, compile_, entry_names, names, posix_only
from _cache_faults_cases import _private_default_dir as _private_default_dir, planted as planted  # fixtures


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
