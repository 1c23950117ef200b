"""Who could have written a cache file: refuse anything another user can write.

A cubin is code: the driver's loader parses it on the host and its kernels run in
our process. So a directory or entry that another user can write is a way for
them to run code as us. Trusted means: owned by us or by root (root can do
anything anyway), and neither group- nor world-writable. Checks take an
``os.stat_result`` from ``fstat`` on an already opened fd, so what was checked is
exactly what gets read (no check/use race through a rename or a symlink).
"""

from __future__ import annotations

import os
import stat


class Untrusted(Exception):
    """A cache directory or entry failed the check; ``str()`` says why."""

    def __init__(self, path, problem: str, fix: str = ""):
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.path!r} {problem}")


class UntrustedDirectory(Untrusted):
    pass


class UntrustedEntry(Untrusted):
    pass


def _describe(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"


def problem(st: os.stat_result, *, directory: bool) -> str | None:
    """Why a file with status ``st`` must not be trusted, or ``None`` if it may."""
    if directory and not stat.S_ISDIR(st.st_mode):
        return f"is not a directory ({_describe(st)})"
    if not directory and not stat.S_ISREG(st.st_mode):
        return f"is not a regular file ({_describe(st)})"
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:
        return None  # no POSIX owners or permission bits to check (Windows)
    euid = geteuid()
    if st.st_uid not in (euid, 0):
        return f"belongs to another user ({_describe(st)}; this process runs as uid {euid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users ({_describe(st)})"
    return None


def _fix_for(path, st: os.stat_result) -> str:
    """What the user can do about an untrusted directory."""
    private = "set CUDATTN_CACHE_DIR to a private directory of your own"
    geteuid = getattr(os, "geteuid", None)
    if stat.S_ISDIR(st.st_mode) and geteuid is not None and st.st_uid == geteuid():
        return f"run `chmod 700 {str(path)!r}` or {private}"
    return private


def check_directory(path, st: os.stat_result) -> None:
    why = problem(st, directory=True)
    if why is not None:
        raise UntrustedDirectory(path, why, _fix_for(path, st))


def check_entry(path, st: os.stat_result) -> None:
    why = problem(st, directory=False)
    if why is not None:
        raise UntrustedEntry(path, why)
