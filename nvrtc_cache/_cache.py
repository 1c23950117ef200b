"""``Cache``: memory layer → disk layer → NVRTC, with one lock per key."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import nvrtc_cache as _package  # for __version__ at call time (tests monkeypatch it)

from . import _entry, _key, _nvrtc, _sysinclude, _trust
from ._ptxas import PtxasReport, parse_ptxas
from ._store import CacheEntry, DiskStore, default_directory

# Real SASS targets only: sm_80, sm_89, sm_90a, sm_100f… ("a"/"f": arch/family-specific).
_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")
_ARCH_OPTIONS = ("-arch", "--gpu-architecture")
_STD_OPTIONS = ("-std", "--std")


@dataclasses.dataclass(frozen=True)
class CompileResult:
    cubin: bytes = dataclasses.field(repr=False)
    arch: str
    lowered_names: dict[str, str]
    log: str = dataclasses.field(repr=False)
    ptxas: dict[str, PtxasReport] = dataclasses.field(repr=False)
    key: str
    source: str  # "memory" | "disk" | "compiled": where it came from this time


@dataclasses.dataclass(frozen=True)
class _Request:
    """A validated, normalised compile request plus the options NVRTC will see."""

    source: bytes
    name: str
    headers: tuple[tuple[str, bytes], ...]
    arch: str
    key_options: tuple[str, ...]  # everything passed to NVRTC but the -I below
    sysinclude: str | None
    name_expressions: tuple[str, ...]

    @property
    def nvrtc_options(self) -> list[str]:
        # The wheel's include dir goes last so a caller's -I is searched first; its
        # path is machine-specific, so the key hashes the headers' contents instead.
        extra = [f"-I{self.sysinclude}"] if self.sysinclude else []
        return [*self.key_options, *extra]


def _as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


def _make_request(source, name, headers, options, arch, name_expressions) -> _Request:
    if not isinstance(arch, str) or not _ARCH.match(arch):
        if isinstance(arch, str) and arch.startswith("compute_"):
            raise ValueError(
                f"arch={arch!r} would produce PTX; nvrtc_cache only produces CUBIN for a "
                f"real target such as 'sm_{arch[len('compute_'):]}'"
            )
        raise ValueError(f"arch must look like 'sm_80', 'sm_89' or 'sm_90a', got {arch!r}")
    if isinstance(options, (str, bytes)):
        raise TypeError("options must be a sequence of strings, not a single string")
    options = tuple(options)
    for option in options:
        if not isinstance(option, str):
            raise TypeError(f"every option must be a str, got {option!r}")
        if option.startswith(_ARCH_OPTIONS):
            raise ValueError(f"pass the target as arch=, not as option {option!r}")
    if isinstance(name_expressions, str):
        raise TypeError("name_expressions must be a sequence of strings")
    fixed = [f"-arch={arch}"]
    if not any(o.startswith(_STD_OPTIONS) for o in options):
        fixed.append("--std=c++17")
    fixed.append("-Xptxas=-v")  # the ptxas report rides in the log
    return _Request(
        source=_as_bytes(source),
        name=name,
        headers=tuple(sorted((str(n), _as_bytes(c)) for n, c in headers.items())),
        arch=arch,
        key_options=(*fixed, *options),
        sysinclude=_sysinclude.include_dir(),
        name_expressions=tuple(sorted(set(name_expressions))),
    )


def _key_for(req: _Request) -> str:
    # Every input is read at call time (not import time) so that a changed NVRTC,
    # package or schema version, or header wheel, always yields a new key.
    return _key.compute_key(
        schema_version=_key.SCHEMA_VERSION,
        package_version=_package.__version__,
        nvrtc_version=_nvrtc.nvrtc_version(),
        arch=req.arch,
        options=req.key_options,
        source=req.source,
        name=req.name,
        headers=req.headers,
        sysinclude_fingerprint=_sysinclude.fingerprint(req.sysinclude),
        name_expressions=req.name_expressions,
    )


def _in_package(module_name: str) -> bool:
    return module_name == __package__ or module_name.startswith(__package__ + ".")


def _stacklevel_outside_package() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside this package."""
    frame, level = sys._getframe(2), 2
    while frame is not None and _in_package(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    return level


def _result(entry: _entry.Entry, source: str) -> CompileResult:
    return CompileResult(
        cubin=entry.cubin,
        arch=entry.arch,
        lowered_names=dict(entry.lowered_names),
        log=entry.log,
        ptxas=parse_ptxas(entry.log),
        key=entry.key,
        source=source,
    )


class Cache:
    """NVRTC compile cache: in-process memory in front of one directory on disk.

    Thread-safe; several processes may share a directory. If the directory cannot
    be created or written, the cache keeps working from memory and warns once.
    A directory that another user could write is never used at all (one warning),
    and an entry another user could write is a miss (one warning): see _trust.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        if directory is None:
            directory = default_directory()
        self.directory = Path(directory).expanduser()
        self.nvrtc_compiles = 0
        self._store = DiskStore(self.directory)
        self._memory: dict[str, _entry.Entry] = {}
        self._lock = threading.Lock()  # guards _memory, _key_locks and the state below
        self._key_locks: dict[str, threading.Lock] = {}
        self._writable: bool | None = None  # unknown until the first write
        self._write_error: str | None = None  # why the last write failed
        self._trusted = True  # False once the directory failed the trust check
        self._distrusted: _trust.Untrusted | None = None  # why
        self._warned: set[str] = set()  # kinds of warning already given

    def __repr__(self) -> str:
        return f"Cache({str(self.directory)!r})"

    def compile(
        self,
        source: str,
        *,
        name: str = "kernel.cu",
        headers: Mapping[str, str] = {},
        options: Sequence[str] = (),
        arch: str,
        name_expressions: Sequence[str] = (),
    ) -> CompileResult:
        """Compile ``source`` to a CUBIN for ``arch``, or fetch it from the cache.

        ``headers`` (include name → contents) are given to NVRTC in memory and are
        part of the key; headers reached through a caller's ``-I<dir>`` are not
        (only the option string is), so pass project headers in ``headers``.
        """
        req = _make_request(source, name, headers, options, arch, name_expressions)
        key = _key_for(req)
        with self._lock:
            if key in self._memory:
                return _result(self._memory[key], "memory")
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        # Threads asking for the same key wait for one compile instead of racing.
        with key_lock:
            try:
                with self._lock:
                    if key in self._memory:
                        return _result(self._memory[key], "memory")
                entry = self._load_from_disk(key, req.arch)
                source_kind = "disk"
                if entry is None:
                    entry = self._compile(req, key)
                    source_kind = "compiled"
                    self._save(entry)
                with self._lock:
                    self._memory[key] = entry
            finally:
                with self._lock:
                    self._key_locks.pop(key, None)
        return _result(entry, source_kind)

    def lookup(
        self,
        source: str,
        *,
        name: str = "kernel.cu",
        headers: Mapping[str, str] = {},
        options: Sequence[str] = (),
        arch: str,
        name_expressions: Sequence[str] = (),
    ) -> CompileResult | None:
        """What :meth:`compile` would return from memory or disk for these arguments, without
        compiling: ``None`` on a miss. Nothing is added to memory (callers that only ask which
        kernels are missing, like a cache warm-up, should not hold every cubin)."""
        req = _make_request(source, name, headers, options, arch, name_expressions)
        key = _key_for(req)
        with self._lock:
            if key in self._memory:
                return _result(self._memory[key], "memory")
        entry = self._load_from_disk(key, req.arch)
        return None if entry is None else _result(entry, "disk")

    def _compile(self, req: _Request, key: str) -> _entry.Entry:
        with self._lock:
            self.nvrtc_compiles += 1  # attempts, failed ones included
        cubin, log, lowered = _nvrtc.run_nvrtc(
            req.source, req.name, req.headers, req.nvrtc_options, req.name_expressions
        )
        return _entry.Entry(key=key, arch=req.arch, cubin=cubin, log=log, lowered_names=lowered)

    def _load_from_disk(self, key: str, arch: str | None) -> _entry.Entry | None:
        if not self._trusted:
            return None
        try:
            return self._store.load(key, arch)
        except _trust.UntrustedDirectory as exc:
            self._distrust(exc)
        except _trust.UntrustedEntry as exc:
            # A miss: the compile that follows replaces the entry (the directory is trusted).
            self._warn_once(
                "entry",
                f"nvrtc_cache: ignoring cache entry {exc.path!r}: it {exc.problem}; "
                f"recompiling and replacing it",
            )
        return None

    def _save(self, entry: _entry.Entry) -> None:
        if self._writable is False or not self._trusted:
            return
        try:
            self._store.save(entry)
        except _trust.UntrustedDirectory as exc:
            self._distrust(exc)
        except OSError as exc:
            self._writable = False
            self._write_error = f"a write failed: {type(exc).__name__}: {exc.strerror or exc}"
            self._warn_once(
                "write",
                f"nvrtc_cache: cannot write to cache directory {str(self.directory)!r} "
                f"({type(exc).__name__}: {exc.strerror or exc}); compiled kernels are "
                f"cached in memory only for this process",
            )
        else:
            self._writable, self._write_error = True, None

    def _distrust(self, exc: _trust.UntrustedDirectory) -> None:
        # Neither read nor write: another user could plant a cubin (code that runs
        # in this process) or read back what we compile.
        self._trusted, self._distrusted = False, exc
        self._warn_once(
            "directory",
            f"nvrtc_cache: not using cache directory {exc.path!r}: it {exc.problem}, so "
            f"another user could plant code that this process would run; compiled "
            f"kernels are cached in memory only for this process. To fix: {exc.fix}",
        )

    def _warn_once(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=_stacklevel_outside_package())

    def entries(self, arch: str | None = None) -> Iterator[CacheEntry]:
        """The entries on disk (by file name; contents are validated on load); with ``arch``,
        only those whose metadata names that target."""
        return self._store.entries(arch)

    def info(self, arch: str | None = None) -> dict[str, str | int | bool | None]:
        """The directory, its entries (``arch``: only that target's) and their bytes, and whether
        it is used and writable; ``why_not_writable`` says why not (``None`` when writable)."""
        entries = list(self.entries(arch))
        trust = self._store.trust_problem() if self._trusted else self._distrusted
        why = self._write_problem(trust)
        return {
            "directory": str(self.directory),
            "entries": len(entries),
            "total_bytes": sum(e.size_bytes for e in entries),
            "writable": why is None,
            "why_not_writable": why,
            "trusted": trust is None,  # False: the directory is not used at all (see _trust)
            "memory_entries": len(self._memory),
            "nvrtc_compiles": self.nvrtc_compiles,
        }

    def _write_problem(self, trust: _trust.Untrusted | None) -> str | None:
        if trust is not None:
            return (f"refused for safety: it {trust.problem}, so another user could plant code that this process "
                    f"would run; to fix: {trust.fix}")
        if self._writable is not None:  # a write was tried: its outcome
            return self._write_error
        return self._store.write_problem()

    def clear(self, arch: str | None = None) -> int:
        """Drop every entry, on disk and in memory (``arch``: only that target's); return how many
        keys were dropped."""
        with self._lock:
            removed = {k for k, e in self._memory.items() if arch is None or e.arch == arch}
            for key in removed:
                del self._memory[key]
        removed |= self._store.clear(arch)
        return len(removed)

    def load(self, key: str) -> CompileResult | None:
        """The valid, trusted entry stored on disk under ``key``, or ``None``."""
        entry = self._load_from_disk(key, None)
        return None if entry is None else _result(entry, "disk")


_default_caches: dict[Path, Cache] = {}
_default_lock = threading.Lock()


def default_cache() -> Cache:
    """The process-wide cache for the default directory (re-read from the environment)."""
    directory = default_directory().resolve()
    with _default_lock:
        cache = _default_caches.get(directory)
        if cache is None:
            cache = _default_caches[directory] = Cache(directory)
        return cache


def compile(
    source: str,
    *,
    name: str = "kernel.cu",
    headers: Mapping[str, str] = {},
    options: Sequence[str] = (),
    arch: str,
    name_expressions: Sequence[str] = (),
    cache: Cache | None = None,
) -> CompileResult:
    """Compile CUDA C++ ``source`` to a CUBIN for ``arch`` through ``cache``
    (default: :func:`default_cache`). See :meth:`Cache.compile`."""
    return (cache if cache is not None else default_cache()).compile(
        source,
        name=name,
        headers=headers,
        options=options,
        arch=arch,
        name_expressions=name_expressions,
    )
