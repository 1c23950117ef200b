"""`cudattn export`: every kernel the API launches, as cubins a program without Python can load.

For each compile target the export writes ``DIR/<arch>/<kernel>.cubin`` (every build
`_kernels.all_kernels` lists: prefill of both families, FP8, decode, combine, append, quantize,
V transpose), ``DIR/manifest.json`` (per cubin: entry points, compile options, ptxas resources,
threads, dynamic shared memory, what it serves; a selection table that maps the inputs of
`_traits.select` and `_decode_traits.select_decode` to a cubin, so a C launcher chooses exactly
as the Python path does; the parameter structs' layouts; cudattn's version and commit) and
``DIR/include/cudattn_params.h`` (`_cabi`). The kernels come from the disk cache, compiled in
parallel first where missing (`_warm`).

A manifest names its format and cudattn version; `read_manifest` refuses another of either,
since a cubin and the parameter layout it reads change together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import nvrtc_cache

from . import __version__, _cabi, _decode_traits, _kernels, _traits

__all__ = ["FORMAT", "ExportError", "export", "read_manifest"]

#: Bumped whenever the manifest's schema or the meaning of a field changes.
FORMAT = 1


class ExportError(RuntimeError):
    """A manifest this cudattn cannot use (another format or version), or an export that failed."""


def _kind(spec) -> str:
    if isinstance(spec, _traits.Variant):
        return "prefill"
    if isinstance(spec, _decode_traits.DecodeVariant):
        return "decode"
    return {"split_kv_combine": "combine", "kv_cache_append": "append", "fp8_transpose_v": "transpose",
            "fp8_amax": "quantize", "fp8_quantize": "quantize", "fp8_dequantize": "dequantize"}[spec.kernel_name]


def _file_name(spec, kind: str) -> str:
    """A readable, unique file name: what `describe` says of a tiled kernel, else the kind and the
    defines that make the build."""
    if isinstance(spec, (_traits.Variant, _decode_traits.DecodeVariant)):
        text = ("prefill " if kind == "prefill" else "") + spec.describe()
    else:
        text = " ".join([kind, *(f"{k.removeprefix('CUDATTN_').lower()}{v}" for k, v in sorted(spec.defines().items()))])
    return re.sub(r"[^a-z0-9_.]", "", text.lower().replace("->", " to ").replace(" ", "_")) + ".cubin"


def _selection_inputs(spec) -> dict:
    if isinstance(spec, (_traits.Variant, _decode_traits.DecodeVariant)):
        d = dataclasses.asdict(spec)
        d.pop("source", None)
        d.pop("kernel_name", None)
        return d
    return {"defines": spec.defines()}


def _selection_table(arch: str, files: dict) -> list[dict]:
    """Every input the Python selection distinguishes, with the cubin it picks (``files``: build key -> file)."""
    limit = _traits.ARCH_SMEM_LIMIT[arch]
    fams = ("sm80", "sm90") if arch in _traits.HOPPER_ARCHS else ("sm80",)
    rows = []

    def add(row, spec):
        row["file"] = files[_build_key(spec)]
        rows.append(row)

    for fam in fams:
        for dt in _traits.DTYPE_NAMES.values():
            dims = _traits.SM90_TILE_DIMS if fam == "sm90" else _traits.TILE_DIMS
            for d in dims:
                for causal in (False, True):
                    short = _traits._SM90_SHORT_CAUSAL.get(d) if fam == "sm90" and causal else None
                    if short:
                        add({"kind": "prefill", "family": fam, "dtype": dt, "tile_dim": d, "causal": causal,
                             "seqlen_q_max": short[0]}, _traits.select(dt, d, causal, limit, fam, seqlen_q=short[0]))
                    add({"kind": "prefill", "family": fam, "dtype": dt, "tile_dim": d, "causal": causal,
                         "seqlen_q_max": None}, _traits.select(dt, d, causal, limit, fam))
        if arch in _traits.FP8_ARCHS:
            fp8_dims = _traits.FP8_SM90_TILE_DIMS if fam == "sm90" else _traits.FP8_TILE_DIMS
            for d in fp8_dims:
                for causal in (False, True):
                    for out in _traits.FP8_OUT_CODES:
                        add({"kind": "prefill", "family": fam, "dtype": _traits.FP8, "out_dtype": out, "tile_dim": d,
                             "causal": causal, "seqlen_q_max": None}, _traits.select(_traits.FP8, d, causal, limit, fam, out))
    for dt in _traits.DTYPE_NAMES.values():
        for d in _decode_traits.DECODE_TILE_DIMS:
            add({"kind": "decode", "dtype": dt, "tile_dim": d}, _decode_traits.select_decode(dt, d, limit))
    for i, o in _decode_traits.COMBINE_PAIRS:
        add({"kind": "combine", "in_dtype": i, "out_dtype": o}, _decode_traits.combine_kernel(i, o))
    add({"kind": "append"}, _decode_traits.APPEND_KERNEL)
    return rows


def _build_key(spec) -> tuple:
    return spec.source, tuple(sorted(spec.defines().items()))


def _rules() -> dict:
    """The parts of the selection that are rules rather than table rows."""
    return {
        "tile_dim": "the smallest tile width in the family's list that is >= head_dim",
        "tile_dims": {"sm80": list(_traits.TILE_DIMS), "sm90": list(_traits.SM90_TILE_DIMS),
                      "fp8_sm80": list(_traits.FP8_TILE_DIMS), "fp8_sm90": list(_traits.FP8_SM90_TILE_DIMS),
                      "decode": list(_decode_traits.DECODE_TILE_DIMS)},
        "family": f"sm90 on {list(_traits.HOPPER_ARCHS)} when every q/k/v stride fits a TMA map (positive, a "
                  "multiple of 16 bytes, below 2**40 bytes), else sm80",
        "seqlen_q_max": "a row with seqlen_q_max applies when seqlen_q <= it (causal only); otherwise the row "
                        "with null",
        "head_dims": list(_traits.SUPPORTED_HEAD_DIMS),
        "fp8_head_dims": "multiples of 16 up to 256",
        "fp8_archs": list(_traits.FP8_ARCHS),
    }


def _git_commit() -> str | None:
    from .bench.manifest import git_commit

    return git_commit()


def export(out_dir: str | os.PathLike, archs: Sequence[str] = ("sm_90a",), *, jobs: int | None = None,
           cache=None, progress: bool = True) -> dict:
    """Write the export for ``archs`` into ``out_dir`` (created; existing files of the same names are
    replaced). Returns the manifest."""
    from . import _warm

    out = Path(out_dir)
    archs = list(dict.fromkeys(archs))
    for arch in archs:
        if arch not in _traits.ARCH_SMEM_LIMIT:
            raise ExportError(f"unknown compile target {arch!r}; cudattn builds for {', '.join(_kernels.ARCHS)}")
    manifest: dict = {
        "format": FORMAT, "cudattn": __version__, "commit": _git_commit(),
        "nvrtc": ".".join(map(str, nvrtc_cache.nvrtc_version())),
        "structs": {_cabi.c_name(name): {"kernel_name": name, **_cabi.layout(cls)} for cls, name in _cabi.STRUCTS},
        "rules": _rules(), "archs": {},
    }
    report = _warm.warm(archs, jobs=jobs, cache=cache, progress=progress)  # one pool for every arch
    if report.failed:
        raise ExportError(f"{len(report.failed)} kernels failed to compile: {report.failed[0][0]}: "
                          f"{report.failed[0][1]}")
    for arch in archs:
        (out / arch).mkdir(parents=True, exist_ok=True)
        kernels: list[dict] = []
        files: dict[tuple, str] = {}
        for spec in _kernels.all_kernels(arch):
            res = _kernels.compile_variant(spec, arch, cache=cache)
            kind = _kind(spec)
            name = _file_name(spec, kind)
            if name in files.values():
                raise ExportError(f"two builds would share {name}")
            files[_build_key(spec)] = name
            (out / arch / name).write_bytes(res.cubin)
            entries = sorted(k for k, r in res.ptxas.items() if r.entry)
            kernels.append({
                "file": name, "kind": kind, "family": spec.family, "source": spec.source, "entries": entries,
                "options": _kernels.options_for(spec), "threads": spec.threads, "dynamic_smem": spec.smem_bytes,
                "ptxas": {e: dataclasses.asdict(res.ptxas[e]) for e in entries},
                "select": _selection_inputs(spec), "sha256": hashlib.sha256(res.cubin).hexdigest(),
            })
        manifest["archs"][arch] = {"kernels": kernels, "selection": _selection_table(arch, files),
                                   "smem_limit": _traits.ARCH_SMEM_LIMIT[arch]}
    (out / "include").mkdir(parents=True, exist_ok=True)
    (out / "include" / "cudattn_params.h").write_text(_cabi.header(__version__, FORMAT), encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The manifest of an export, refused (ExportError) if another format or cudattn version wrote it."""
    path = Path(out_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(f"{path} does not exist: run `python -m cudattn export --out {out_dir}` first") from None
    fmt, ver = manifest.get("format"), manifest.get("cudattn")
    if fmt != FORMAT or ver != __version__:
        raise ExportError(f"{path} was written by cudattn {ver} (export format {fmt}); this is cudattn {__version__} "
                          f"(format {FORMAT}): export again with this version")
    return manifest
