"""The cache directory: where it is, and atomic, corruption-tolerant, trusted files in it."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from . import _entry, _trust

_ENTRY_SUFFIX = ".cubin-entry"
_ENTRY_NAME = re.compile(r"^([0-9a-f]{64})" + re.escape(_ENTRY_SUFFIX) + "$")
_TEMP_SUFFIX = ".tmp"
# Where flock is missing, a temp file this old is taken to be left by a writer
# that died; younger ones may belong to a writer about to os.replace() them.
_STALE_TEMP_SECONDS = 3600

_O_BINARY = getattr(os, "O_BINARY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO planted under an entry's name must not hang the reader.
_READ_FLAGS = os.O_RDONLY | _O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _O_CLOEXEC | _O_BINARY
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY
# What open(O_NOFOLLOW) says about a symlink: ELOOP (Linux, macOS), EMLINK (FreeBSD).
_SYMLINK_ERRNOS = {errno.ELOOP, errno.EMLINK}
# openat() and friends: resolve names inside an opened directory.
_AT = hasattr(os, "O_DIRECTORY") and {os.open, os.rename, os.unlink, os.stat} <= os.supports_dir_fd


def default_directory() -> Path:
    """``$CUDATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/cudattn``, else ``~/.cache/cudattn``."""
    explicit = os.environ.get("CUDATTN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "cudattn"
    return Path.home() / ".cache" / "cudattn"


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    size_bytes: int


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Dir:
    """An opened directory. Names are resolved relative to its fd (openat…) where the
    OS allows, so once its fstat passed the trust check, swapping the path for
    another directory cannot redirect a later read or write."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC) if _AT else None

    def __enter__(self) -> _Dir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _at(self, name: str) -> tuple[str, dict]:
        if self.fd is None:
            return os.path.join(self.path, name), {}
        return name, {"dir_fd": self.fd}

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd) if self.fd is not None else os.stat(self.path)

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        path, at = self._at(name)
        return os.open(path, flags, mode, **at)

    def lstat(self, name: str) -> os.stat_result:
        path, at = self._at(name)
        return os.stat(path, follow_symlinks=False, **at)

    def replace(self, src: str, dst: str) -> None:
        if self.fd is None:
            os.replace(os.path.join(self.path, src), os.path.join(self.path, dst))
        else:
            os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        path, at = self._at(name)
        os.unlink(path, **at)

    def listdir(self) -> list[str]:
        return os.listdir(self.fd if self.fd is not None else self.path)

    def sync(self) -> None:
        # fsync the directory so a completed os.replace survives a power loss.
        # Best effort: some systems and filesystems cannot fsync a directory.
        if self.fd is not None:
            try:
                os.fsync(self.fd)
            except OSError:
                pass


class DiskStore:
    """One file per key, in a directory only we (or root) can write.

    Reading never raises but :class:`~._trust.Untrusted`; anything else that goes
    wrong (missing, unreadable, truncated, corrupt) is a miss. Writing raises
    ``OSError`` or ``UntrustedDirectory``.
    """

    def __init__(self, directory: Path):
        self.directory = directory

    def path_for(self, key: str) -> Path:
        return self.directory / (key + _ENTRY_SUFFIX)

    def ensure_directory(self) -> None:
        if self.directory.is_dir():
            return
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.directory, 0o700)
        except FileExistsError:
            return  # made by another process meanwhile: the trust check judges it
        # The umask can only clear bits of mkdir's 0700 (never open it up to
        # others); put back any owner bit it cleared.
        os.chmod(self.directory, 0o700)

    def _open_trusted(self) -> _Dir:
        """The directory, opened and checked. Raises ``OSError`` or ``UntrustedDirectory``."""
        directory = _Dir(self.directory)
        try:
            _trust.check_directory(self.directory, directory.stat())
        except BaseException:
            directory.close()
            raise
        return directory

    def trust_problem(self) -> _trust.Untrusted | None:
        """Why the directory must not be used, or ``None`` (also when it does not exist yet)."""
        try:
            self._open_trusted().close()
        except _trust.Untrusted as exc:
            return exc
        except OSError:
            pass
        return None

    def load(self, key: str, arch: str | None = None) -> _entry.Entry | None:
        try:
            directory = self._open_trusted()
        except OSError:
            return None  # no directory yet, or not searchable: a miss
        name = key + _ENTRY_SUFFIX
        with directory:
            try:
                fd = directory.open(name, _READ_FLAGS)
            except OSError as exc:
                if exc.errno in _SYMLINK_ERRNOS:
                    raise _trust.UntrustedEntry(self.path_for(key), "is a symbolic link") from None
                return None
            with os.fdopen(fd, "rb") as f:
                # fstat of the fd we read from: the very file checked is the one loaded.
                _trust.check_entry(self.path_for(key), os.fstat(f.fileno()))
                try:
                    blob = f.read()
                except OSError:
                    return None
        try:
            return _entry.decode(blob, key, arch)
        except ValueError:
            return None  # truncated or corrupt: recompile and overwrite

    def save(self, entry: _entry.Entry) -> None:
        blob = _entry.encode(entry)
        self.ensure_directory()
        with self._open_trusted() as directory:
            # Readers only ever open the final name, which os.replace swaps in
            # atomically, so a writer killed at any point leaves either the old
            # entry or the new one, plus perhaps an orphaned temp file.
            temp = f".{entry.key[:16]}-{secrets.token_hex(8)}{_TEMP_SUFFIX}"
            fd = directory.open(temp, _CREATE_FLAGS, 0o600)
            try:
                try:
                    if fcntl is not None:
                        # Held until close: tells clear() this temp has a live writer.
                        fcntl.flock(fd, fcntl.LOCK_EX)
                    _write_all(fd, blob)
                    os.fsync(fd)  # data on disk before the name points at it
                finally:
                    os.close(fd)
                directory.replace(temp, entry.key + _ENTRY_SUFFIX)
            except FileNotFoundError:
                return  # a concurrent clear() took the temp: the entry is just not saved
            except BaseException:
                try:
                    directory.unlink(temp)
                except OSError:
                    pass
                raise
            directory.sync()

    def entries(self, arch: str | None = None) -> Iterator[CacheEntry]:
        """The entries on disk; with ``arch``, only those whose metadata names it."""
        try:
            directory = _Dir(self.directory)
        except OSError:
            return iter(())
        found = []
        with directory:
            for file_name in sorted(directory.listdir()):
                match = _ENTRY_NAME.match(file_name)
                if not match or (arch is not None and _arch_of(directory, file_name) != arch):
                    continue  # temp files, anything else that is not ours, other arches
                try:
                    size = directory.lstat(file_name).st_size
                except OSError:
                    continue  # removed by a concurrent clear()
                found.append(CacheEntry(match.group(1), self.directory / file_name, size))
        return iter(found)

    def clear(self, arch: str | None = None) -> set[str]:
        """Remove every entry and abandoned temp file; with ``arch``, only the entries whose
        metadata names it (a temp file's arch is unknown, so those stay). Return the keys removed."""
        removed = set()
        try:
            directory = _Dir(self.directory)
        except OSError:
            return removed
        with directory:
            for file_name in directory.listdir():
                match = _ENTRY_NAME.match(file_name)
                if match and (arch is None or _arch_of(directory, file_name) == arch):
                    try:
                        directory.unlink(file_name)
                        removed.add(match.group(1))
                    except FileNotFoundError:
                        pass
                elif arch is None and _is_temp(file_name) and _abandoned(directory, file_name):
                    try:
                        directory.unlink(file_name)
                    except OSError:
                        pass
        return removed

    def write_problem(self) -> str | None:
        """Why an entry could not be written here now, or ``None``: the directory (or, before it
        exists, the nearest existing ancestor) must be a directory this process may write."""
        path = self.directory
        try:
            while not path.exists() and path != path.parent:
                path = path.parent
            if not path.is_dir():
                return ("it exists and is not a directory" if path == self.directory
                        else f"cannot be created: {str(path)!r} is not a directory")
            if not os.access(path, os.W_OK | os.X_OK):
                where = "" if path == self.directory else f"cannot be created in {str(path)!r}: "
                return f"{where}no write permission (this process runs as uid {_uid()})"
        except OSError as exc:
            return f"cannot be inspected: {exc.strerror or exc}"
        return None


def _uid() -> str:
    geteuid = getattr(os, "geteuid", None)
    return str(geteuid()) if geteuid else "?"


def _arch_of(directory: _Dir, file_name: str) -> str | None:
    """The arch an entry's metadata names; ``None`` when it cannot be read."""
    try:
        fd = directory.open(file_name, _READ_FLAGS)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            return _entry.read_arch(f)
        except (OSError, ValueError):
            return None


def _is_temp(file_name: str) -> bool:
    return file_name.startswith(".") and file_name.endswith(_TEMP_SUFFIX)


def _abandoned(directory: _Dir, file_name: str) -> bool:
    """True for a temp file whose writer is gone (it died before os.replace)."""
    try:
        fd = directory.open(file_name, _READ_FLAGS)
    except OSError:
        return False
    try:
        if fcntl is None:
            return os.fstat(fd).st_mtime < time.time() - _STALE_TEMP_SECONDS
        try:
            # The kernel drops a dead writer's lock, so getting it means no writer.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True
    finally:
        os.close(fd)
