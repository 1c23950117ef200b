"""The cache directory: where it is, and atomic, corruption-tolerant files in it."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from . import _entry

_ENTRY_SUFFIX = ".cubin-entry"
_ENTRY_NAME = re.compile(r"^([0-9a-f]{64})" + re.escape(_ENTRY_SUFFIX) + "$")
_TEMP_SUFFIX = ".tmp"
# A temp file this old was left by a process that died mid-write; younger ones may
# belong to a writer that is about to os.replace() them.
_STALE_TEMP_SECONDS = 3600


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


class DiskStore:
    """One file per key. Never raises on read; raises ``OSError`` on a failed write."""

    def __init__(self, directory: Path):
        self.directory = directory

    def path_for(self, key: str) -> Path:
        return self.directory / (key + _ENTRY_SUFFIX)

    def ensure_directory(self) -> None:
        if self.directory.is_dir():
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkdir's mode is filtered by the umask; compiled code is private by default.
        os.chmod(self.directory, 0o700)

    def load(self, key: str) -> _entry.Entry | None:
        try:
            blob = self.path_for(key).read_bytes()
            return _entry.decode(blob, key)
        except (OSError, ValueError):
            return None  # missing, unreadable, truncated or corrupt: all a miss

    def save(self, entry: _entry.Entry) -> None:
        blob = _entry.encode(entry)
        # mkstemp opens with O_EXCL, so names are unique across processes and threads;
        # readers only ever see the final name, which os.replace swaps atomically.
        fd, temp = tempfile.mkstemp(
            dir=self.directory, prefix=f".{entry.key[:16]}-", suffix=_TEMP_SUFFIX
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path_for(entry.key))
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise

    def entries(self) -> Iterator[CacheEntry]:
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return
        for file_name in names:
            match = _ENTRY_NAME.match(file_name)
            if not match:
                continue
            path = self.directory / file_name
            try:
                size = path.stat().st_size
            except OSError:
                continue  # removed by a concurrent clear()
            yield CacheEntry(key=match.group(1), path=path, size_bytes=size)

    def clear(self) -> set[str]:
        """Remove every entry (and stale temp files); return the keys removed."""
        removed = set()
        for entry in list(self.entries()):
            try:
                entry.path.unlink()
                removed.add(entry.key)
            except FileNotFoundError:
                pass
        self._remove_stale_temps()
        return removed

    def _remove_stale_temps(self) -> None:
        cutoff = time.time() - _STALE_TEMP_SECONDS
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for file_name in names:
            if file_name.startswith(".") and file_name.endswith(_TEMP_SUFFIX):
                path = self.directory / file_name
                try:
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                except OSError:
                    pass
