"""Thin, checked wrapper over ``cuda.bindings.nvrtc``: one program in, cubin + log out."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ._errors import CompileError


def _bindings():
    # Imported on first use: loading the NVRTC bindings costs ~50 ms and a shared
    # library, and ``import nvrtc_cache`` must stay cheap Python.
    from cuda.bindings import nvrtc

    return nvrtc


class _NvrtcCallFailed(Exception):
    def __init__(self, result):
        self.result = result
        super().__init__(getattr(result, "name", str(result)))


def _check(ret):
    """Unwrap an ``(err, *values)`` tuple, raising on any result but success."""
    err, *values = ret
    if err != _bindings().nvrtcResult.NVRTC_SUCCESS:
        raise _NvrtcCallFailed(err)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """``(major, minor)`` of the NVRTC library that is actually loaded."""
    major, minor = _check(_bindings().nvrtcVersion())
    return int(major), int(minor)


def _read_buffer(prog, size_fn, get_fn) -> bytes:
    size = _check(size_fn(prog))
    buf = bytes(size)
    _check(get_fn(prog, buf))
    return buf


def _read_log(prog) -> str:
    nvrtc = _bindings()
    raw = _read_buffer(prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
    # The reported size counts the C string's terminating NUL.
    return raw.rstrip(b"\0").decode("utf-8", errors="replace")


def run_nvrtc(
    source: bytes,
    name: str,
    headers: Sequence[tuple[str, bytes]],
    options: Sequence[str],
    name_expressions: Sequence[str],
) -> tuple[bytes, str, dict[str, str]]:
    """Compile one program to cubin. Returns ``(cubin, log, lowered_names)``.

    Raises :class:`CompileError` with the full log on any failure.
    """
    nvrtc = _bindings()
    options = list(options)
    encoded_options = [o.encode() for o in options]
    log = ""
    try:
        prog = _check(
            nvrtc.nvrtcCreateProgram(
                source,
                name.encode(),
                len(headers),
                [contents for _, contents in headers],
                [include_name.encode() for include_name, _ in headers],
            )
        )
        try:
            for expr in name_expressions:
                _check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()))
            compiled = nvrtc.nvrtcCompileProgram(prog, len(encoded_options), encoded_options)
            log = _read_log(prog)
            _check(compiled)
            cubin = _read_buffer(prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
            lowered = {
                expr: _check(nvrtc.nvrtcGetLoweredName(prog, expr.encode())).decode()
                for expr in name_expressions
            }
        finally:
            _check(nvrtc.nvrtcDestroyProgram(prog))
    except _NvrtcCallFailed as failure:
        raise CompileError(str(failure), log=log, options=options, name=name) from None
    if not cubin:
        # E.g. an option such as -dlto made NVRTC emit something other than SASS.
        raise CompileError("no CUBIN produced", log=log, options=options, name=name)
    return cubin, log, lowered
