"""On-disk entry format: self-describing, checksummed, parsed without trusting it.

Layout (little-endian)::

    magic        8 bytes   b"NVRTCCU\\0"
    version      u32       ENTRY_FORMAT
    payload_len  u64
    sha256      32 bytes   of the payload
    payload:
        meta_len u32
        meta     JSON (utf-8): key, arch, log, lowered_names
        cubin    the rest

Anything that does not match exactly (short file, wrong magic/version, length or
checksum mismatch, bad JSON, an entry for another key or arch) raises ``ValueError``,
which the store turns into a cache miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct

MAGIC = b"NVRTCCU\0"
ENTRY_FORMAT = 1
_HEADER = struct.Struct("<8sIQ32s")
_META_LEN = struct.Struct("<I")


@dataclasses.dataclass(frozen=True)
class Entry:
    key: str
    arch: str
    cubin: bytes
    log: str
    lowered_names: dict[str, str]


def encode(entry: Entry) -> bytes:
    meta = json.dumps(
        {
            "key": entry.key,
            "arch": entry.arch,
            "log": entry.log,
            "lowered_names": entry.lowered_names,
        },
        sort_keys=True,
    ).encode()
    payload = _META_LEN.pack(len(meta)) + meta + entry.cubin
    header = _HEADER.pack(MAGIC, ENTRY_FORMAT, len(payload), hashlib.sha256(payload).digest())
    return header + payload


def decode(blob: bytes, expected_key: str, expected_arch: str | None = None) -> Entry:
    if len(blob) < _HEADER.size:
        raise ValueError("truncated header")
    magic, version, payload_len, checksum = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ValueError("bad magic")
    if version != ENTRY_FORMAT:
        raise ValueError(f"entry format {version}, expected {ENTRY_FORMAT}")
    payload = blob[_HEADER.size :]
    if len(payload) != payload_len:
        raise ValueError("truncated payload")
    if hashlib.sha256(payload).digest() != checksum:
        raise ValueError("checksum mismatch")
    if len(payload) < _META_LEN.size:  # else unpack_from raises struct.error, not ValueError
        raise ValueError("payload too short")
    (meta_len,) = _META_LEN.unpack_from(payload)
    meta_end = _META_LEN.size + meta_len
    try:
        meta = json.loads(payload[_META_LEN.size : meta_end])
        entry = Entry(
            key=str(meta["key"]),
            arch=str(meta["arch"]),
            cubin=payload[meta_end:],
            log=str(meta["log"]),
            lowered_names={str(k): str(v) for k, v in meta["lowered_names"].items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"unparsable metadata: {exc}") from None
    if entry.key != expected_key:
        raise ValueError("entry belongs to another key")
    # The key already covers the arch; checking it too means a colliding or forged
    # entry still cannot hand a device code for the wrong architecture.
    if expected_arch is not None and entry.arch != expected_arch:
        raise ValueError(f"entry is for {entry.arch!r}, expected {expected_arch!r}")
    if not entry.cubin.startswith(b"\x7fELF"):
        raise ValueError("payload is not an ELF cubin")
    return entry


def read_arch(f) -> str:
    """The arch an entry's metadata names, read from the open file ``f`` without the cubin and
    without the checksum (for listing and clearing by arch; loading validates everything).
    Raises ``ValueError`` on anything that is not an entry's header and metadata."""
    head = f.read(_HEADER.size + _META_LEN.size)
    if len(head) < _HEADER.size + _META_LEN.size:
        raise ValueError("truncated header")
    magic, version, _, _ = _HEADER.unpack_from(head)
    if magic != MAGIC or version != ENTRY_FORMAT:
        raise ValueError("not an entry of this format")
    (meta_len,) = _META_LEN.unpack_from(head, _HEADER.size)
    try:
        return str(json.loads(f.read(meta_len))["arch"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unparsable metadata: {exc}") from None
