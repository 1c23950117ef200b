"""The cache key: a labeled, length-prefixed sha256 over everything that shapes the cubin."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# Bump when the meaning of an entry changes (fields, fixed options, entry format),
# so entries written by an older layout can never be served.
SCHEMA_VERSION = 1


def _field(digest, label: str, value: bytes | str) -> None:
    # Label + length prefix make the encoding injective: ("ab", "c") and ("a", "bc")
    # hash differently, and a value can never be mistaken for the next field.
    if isinstance(value, str):
        value = value.encode()
    digest.update(label.encode() + b"\0")
    digest.update(len(value).to_bytes(8, "little"))
    digest.update(value)


def compute_key(
    *,
    schema_version: int,
    package_version: str,
    nvrtc_version: tuple[int, int],
    arch: str,
    options: Sequence[str],
    source: bytes,
    name: str,
    headers: Sequence[tuple[str, bytes]],
    sysinclude_fingerprint: str,
    name_expressions: Sequence[str],
) -> str:
    digest = hashlib.sha256()
    _field(digest, "schema", str(schema_version))
    _field(digest, "package", package_version)
    _field(digest, "nvrtc", "%d.%d" % tuple(nvrtc_version))
    _field(digest, "arch", arch)
    _field(digest, "n_options", str(len(options)))
    for option in options:  # order matters: later flags override earlier ones
        _field(digest, "option", option)
    _field(digest, "source", source)
    _field(digest, "source_name", name)
    _field(digest, "n_headers", str(len(headers)))
    for include_name, contents in sorted(headers):
        _field(digest, "header_name", include_name)
        _field(digest, "header", contents)
    _field(digest, "sysinclude", sysinclude_fingerprint)
    _field(digest, "n_name_expressions", str(len(name_expressions)))
    for expr in sorted(name_expressions):
        _field(digest, "name_expression", expr)
    return digest.hexdigest()
