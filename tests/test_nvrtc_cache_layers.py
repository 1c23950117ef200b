"""nvrtc_cache's memory and on-disk CUBIN layers: hits, damaged entries, processes and threads
racing on one key, unwritable directories, and where the cache lives. CPU only (NVRTC needs no
GPU).
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
import warnings

import pytest

from nvrtc_cache import (
    Cache,
    compile,
    default_cache,
)
from _nvrtc_cases import BASE, ELF_MAGIC, HEADERS, SOURCE, _compile, _files
from _nvrtc_cases import _private_default_dir as _private_default_dir, cache as cache  # fixtures


# --- memory and disk layers ---------------------------------------------------------


def test_memory_hit(cache):
    first = _compile(cache)
    second = _compile(cache)
    assert (first.source, second.source) == ("compiled", "memory")
    assert second.cubin == first.cubin and second.key == first.key
    assert cache.nvrtc_compiles == 1


def test_results_do_not_share_mutable_state(cache):
    first = _compile(cache, name_expressions=["add_n<3>"])
    # NVRTC 13.0 on the GPU machines sometimes returns an empty log, hence no ptxas report at all.
    had_ptxas = bool(first.ptxas)
    first.lowered_names.clear()
    first.ptxas.clear()
    second = _compile(cache, name_expressions=["add_n<3>"])
    assert second.lowered_names and bool(second.ptxas) == had_ptxas


def test_disk_hit_skips_nvrtc(tmp_path):
    compiled = _compile(Cache(tmp_path), name_expressions=["add_n<3>"])
    fresh = Cache(tmp_path)
    hit = _compile(fresh, name_expressions=["add_n<3>"])
    assert hit.source == "disk" and fresh.nvrtc_compiles == 0
    assert hit.cubin == compiled.cubin
    assert hit.log == compiled.log and hit.ptxas == compiled.ptxas
    assert hit.lowered_names == compiled.lowered_names
    assert _compile(fresh, name_expressions=["add_n<3>"]).source == "memory"


def _damage_flip_payload(path):
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))


def _damage_flip_magic(path):
    blob = bytearray(path.read_bytes())
    blob[0] ^= 0xFF
    path.write_bytes(bytes(blob))


def _damage_truncate_half(path):
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])


def _damage_empty(path):
    path.write_bytes(b"")


def _damage_garbage(path):
    path.write_bytes(b"not an entry at all" * 10)


@pytest.mark.parametrize(
    "damage",
    [
        _damage_flip_payload,
        _damage_flip_magic,
        _damage_truncate_half,
        _damage_empty,
        _damage_garbage,
    ],
    ids=lambda f: f.__name__.removeprefix("_damage_"),
)
def test_damaged_entry_is_a_miss_and_is_rewritten(tmp_path, damage):
    good = _compile(Cache(tmp_path))
    (entry,) = Cache(tmp_path).entries()
    damage(entry.path)

    cache = Cache(tmp_path)
    again = _compile(cache)
    assert again.source == "compiled" and cache.nvrtc_compiles == 1
    assert again.cubin == good.cubin

    healed = Cache(tmp_path)
    assert _compile(healed).source == "disk" and healed.nvrtc_compiles == 0


def test_entry_under_another_keys_name_is_a_miss(tmp_path):
    a = _compile(Cache(tmp_path))
    b_key = _compile(Cache(tmp_path / "elsewhere"), arch="sm_89").key
    cache = Cache(tmp_path)
    (cache.directory / f"{b_key}.cubin-entry").write_bytes(
        (cache.directory / f"{a.key}.cubin-entry").read_bytes()
    )
    assert _compile(cache, arch="sm_89").source == "compiled"


def _race_worker(directory, barrier, results):
    try:
        cache = Cache(directory)
        barrier.wait(timeout=60)
        res = _compile(cache)
        results.put((res.key, res.cubin, res.source))
    except BaseException as exc:  # report, don't hang the parent
        results.put(("error", repr(exc), ""))


def test_processes_racing_on_one_key(tmp_path):
    directory = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    workers = [
        ctx.Process(target=_race_worker, args=(str(directory), barrier, results)) for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    assert all(key != "error" for key, _, _ in outcomes), outcomes
    keys, cubins, _ = zip(*outcomes)
    assert len(set(keys)) == 1 and len(set(cubins)) == 1
    assert cubins[0].startswith(ELF_MAGIC)
    assert _files(directory) == [f"{keys[0]}.cubin-entry"]  # one entry, no temp files
    loaded = Cache(directory).load(keys[0])
    assert loaded is not None and loaded.cubin == cubins[0]


def test_threads_racing_on_one_key_compile_once(cache):
    barrier = threading.Barrier(8)
    results = []

    def work():
        barrier.wait()
        results.append(_compile(cache))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.nvrtc_compiles == 1
    assert len({r.cubin for r in results}) == 1 and len(results) == 8
    assert sorted(r.source for r in results) == ["compiled"] + ["memory"] * 7


# --- unwritable directories ---------------------------------------------------------


def _compile_twice_counting_warnings(cache):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _compile(cache)
        second = _compile(cache, source=SOURCE + "// another kernel\n")
    assert first.source == second.source == "compiled"
    assert first.cubin.startswith(ELF_MAGIC) and second.cubin.startswith(ELF_MAGIC)
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in runtime]
    assert str(cache.directory) in str(runtime[0].message)
    assert _compile(cache).source == "memory"
    assert cache.info()["writable"] is False


def test_directory_under_a_regular_file_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _compile_twice_counting_warnings(Cache(blocker / "cache"))


def test_read_only_directory_falls_back_to_memory(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("this process ignores permission bits (root with CAP_DAC_OVERRIDE)")
        _compile_twice_counting_warnings(Cache(directory))
    finally:
        directory.chmod(0o700)


# --- where the cache lives ----------------------------------------------------------


def test_created_directory_is_private(tmp_path):
    cache = Cache(tmp_path / "new" / "cache")
    assert not cache.directory.exists()  # nothing happens until the first compile
    _compile(cache)
    assert stat.S_IMODE(cache.directory.stat().st_mode) == 0o700


def test_environment_chooses_the_default_directory(tmp_path, monkeypatch):
    chosen = tmp_path / "chosen"
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(chosen))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Cache().directory == chosen
    res = compile(BASE["source"], headers=HEADERS, arch="sm_80")  # the module-level entry point
    assert res.source == "compiled"
    assert _files(chosen) == [f"{res.key}.cubin-entry"]
    assert stat.S_IMODE(chosen.stat().st_mode) == 0o700
    assert compile(BASE["source"], headers=HEADERS, arch="sm_80").source == "memory"
    assert default_cache() is default_cache()

    monkeypatch.delenv("CUDATTN_CACHE_DIR")
    assert Cache().directory == tmp_path / "xdg" / "cudattn"
    assert default_cache().directory == (tmp_path / "xdg" / "cudattn").resolve()

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Cache().directory == tmp_path / "home" / ".cache" / "cudattn"
