"""`cudattn export`: every kernel the API launches, as cubins a program without Python can load.

For each compile target the export writes ``DIR/<arch>/<kernel>.cubin`` (every build
`_catalog.all_kernels` lists: prefill of both families, FP8, decode, combine, append, quantize,
V transpose, backward), ``DIR/manifest.json`` (per cubin: entry points, compile options, ptxas
resources, threads, dynamic shared memory (a backward cubin: per entry point, under "launch"), what
it serves; a selection table that maps the inputs of `_kernels.traits.select`,
`_kernels.decode_traits.select_decode` and `_kernels.backward_traits.select_backward` to a cubin, so a C
launcher chooses exactly as the Python path does; the parameter structs' layouts; cudattn's version
and commit), ``DIR/include/cudattn_params.h`` (`_tools.cabi`), ``DIR/include/cudattn_kernels.h`` (the
selection table as a C array, `_tools.cbuild`), ``DIR/include/cudattn.h`` with
``cudattn_backward.h`` (the header-only launcher) and ``DIR/examples/attention.c`` (a C program
that uses them). The kernels come from the disk cache, compiled in
parallel first where missing (`_tools.warm`).

A manifest names its format and cudattn version; `read_manifest` refuses another of either,
since a cubin and the parameter layout it reads change together. Exports into one directory add
up: an earlier export's other targets stay listed when it was written by the same cudattn (format,
version, commit, structs and rules equal); otherwise they are dropped, with a note, and the files
the old manifest listed that the new one does not are removed. `--out` is checked before anything
compiles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import nvrtc_cache

from .. import __version__
from . import cabi as _cabi
from .cbuild import ExportError, kernel_table_header
from .._kernels import backward_traits as _bwd_traits
from .._kernels import decode_traits as _decode_traits
from .._kernels import registry as _kernels
from .._kernels import catalog as _catalog
from .._kernels import traits as _traits
from .._spec.modifiers import MOD_ALIBI, MOD_SOFTCAP

__all__ = ["FORMAT", "ExportError", "OutDirError", "check_out", "export", "read_manifest"]

#: Bumped whenever the manifest's schema or the meaning of a field changes.
FORMAT = 3


#: The launcher's headers, copied into DIR/include as they are (cudattn.h includes the others).
HEADERS = ("cudattn.h", "cudattn_backward.h")


class OutDirError(ExportError):
    """The export directory cannot be created or written (found before anything compiles)."""


def _kind(spec) -> str:
    if isinstance(spec, _bwd_traits.BwdKernel):
        return "backward"
    if isinstance(spec, _traits.Variant):
        return "prefill"
    if isinstance(spec, _decode_traits.DecodeVariant):
        return "decode"
    return {"split_kv_combine": "combine", "kv_cache_append": "append", "kv_cache_gather": "gather", "fp8_transpose_v": "transpose",
            "fp8_amax": "quantize", "fp8_quantize": "quantize", "fp8_dequantize": "dequantize"}[spec.kernel_name]


def _file_name(spec, kind: str) -> str:
    """A readable, unique file name: what `describe` says of a tiled kernel, else the kind and the
    defines that make the build."""
    if isinstance(spec, (_traits.Variant, _decode_traits.DecodeVariant)):
        text = ("prefill " if kind == "prefill" else "") + spec.describe()
    elif kind == "backward":  # one cubin for the four entry points: named without the main one's
        text = spec.describe().replace(f" {spec.entry}", "", 1)
    else:
        text = " ".join([kind, *(f"{k.removeprefix('CUDATTN_').lower()}{v}" for k, v in sorted(spec.defines().items()))])
    return re.sub(r"[^a-z0-9_.]", "", text.lower().replace("->", " to ").replace(" ", "_")) + ".cubin"


def _selection_inputs(spec) -> dict:
    if isinstance(spec, (_traits.Variant, _decode_traits.DecodeVariant, _bwd_traits.BwdKernel)):
        d = dataclasses.asdict(spec)
        for name in ("source", "kernel_name", "entry"):
            d.pop(name, None)
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
                    # Rows bounded by the query length (the launcher takes the tightest that holds)
                    for bound in reversed(_traits.row_bounds(d, causal, fam)):
                        add({"kind": "prefill", "family": fam, "dtype": dt, "tile_dim": d, "causal": causal,
                             "seqlen_q_max": bound}, _traits.select(dt, d, causal, limit, fam, seqlen_q=bound))
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
            one = _decode_traits.ONE_FRAG_ROWS
            add({"kind": "decode", "dtype": dt, "tile_dim": d, "rows_max": one},
                _decode_traits.select_decode(dt, d, limit, rows=one))
            add({"kind": "decode", "dtype": dt, "tile_dim": d, "rows_max": None},
                _decode_traits.select_decode(dt, d, limit))
    for i, o in _decode_traits.COMBINE_PAIRS:
        add({"kind": "combine", "in_dtype": i, "out_dtype": o}, _decode_traits.combine_kernel(i, o))
    add({"kind": "append"}, _decode_traits.APPEND_KERNEL)
    for dt in _traits.DTYPE_NAMES.values():
        for d in _bwd_traits.BWD_TILE_DIMS:
            for causal in (False, True):
                for mods in _BWD_MODS:
                    add({"kind": "backward", "family": "sm80", "dtype": dt, "tile_dim": d, "causal": causal,
                         "mods": mods}, _bwd_traits.select_backward(dt, d, causal, limit, mods))
        if arch in _traits.HOPPER_ARCHS:  # the Hopper kernel: no compiled-in modifiers
            for d in _bwd_traits.SM90_BWD_TILE_DIMS:
                for causal in (False, True):
                    add({"kind": "backward", "family": "sm90", "dtype": dt, "tile_dim": d, "causal": causal, "mods": 0},
                        _bwd_traits.select_backward(dt, d, causal, limit, 0, "sm90"))
    return rows


#: The backward's compile-time modifiers (`_spec.modifiers`): none, softcap, ALiBi, both.
_BWD_MODS = (0, MOD_SOFTCAP, MOD_ALIBI, MOD_SOFTCAP | MOD_ALIBI)


def _launch(spec) -> dict | None:
    """A backward build's entry points with the threads and dynamic shared memory each launches
    with (`_kernels.backward.run_backward`); None for a build of one entry point."""
    if not isinstance(spec, _bwd_traits.BwdKernel):
        return None
    return {e: {"threads": spec.entry_point(e).threads, "dynamic_smem": spec.entry_point(e).smem_bytes}
            for e in spec.entries}


def _build_key(spec) -> tuple:
    return spec.source, tuple(sorted(spec.defines().items()))


def _rules() -> dict:
    """The parts of the selection that are rules rather than table rows."""
    return {
        "tile_dim": "the smallest tile width in the family's list that is >= head_dim",
        "tile_dims": {"sm80": list(_traits.TILE_DIMS), "sm90": list(_traits.SM90_TILE_DIMS),
                      "fp8_sm80": list(_traits.FP8_TILE_DIMS), "fp8_sm90": list(_traits.FP8_SM90_TILE_DIMS),
                      "decode": list(_decode_traits.DECODE_TILE_DIMS), "backward": list(_bwd_traits.BWD_TILE_DIMS),
                      "backward_sm90": list(_bwd_traits.SM90_BWD_TILE_DIMS)},
        "family": f"sm90 on {list(_traits.HOPPER_ARCHS)} when every q/k/v stride fits a TMA map (positive, a "
                  "multiple of 16 bytes, below 2**40 bytes), else sm80",
        "backward_family": f"sm90 on {list(_traits.HOPPER_ARCHS)} when the call has no softcap or ALiBi, head_dim "
                           f"<= {_bwd_traits.SM90_BWD_TILE_DIMS[-1]} and q/k/v/dout strides that fit a TMA map, "
                           "else sm80",
        "seqlen_q_max": "of a tile width's rows with seqlen_q_max >= seqlen_q, the one with the smallest "
                        "applies; where none holds, the row with null",
        "rows_max": "decode: a row with rows_max applies when (heads_q / heads_kv) * seqlen_q <= it; otherwise "
                    "the row with null",
        "decode_blocks_per_sm": "the split heuristic's blocks an SM: 2 where two of the row's blocks (dynamic "
                                "smem + 1 KiB each) fit an SM's shared memory and the cache is paged or the row's "
                                "block_m is 16; else 1",
        "decode_split_tiles_min": "the fewest key tiles a split takes: the build's tiles.split_tiles_min (the "
                                  "kernel table's split_tiles_min column)",
        "head_dims": list(_traits.SUPPORTED_HEAD_DIMS),
        "fp8_head_dims": "multiples of 16 up to 256",
        "fp8_archs": list(_traits.FP8_ARCHS),
        "backward": "tile_dim as for prefill, from tile_dims.backward (head_dim a multiple of 8 up to 256); mods: 1 "
                    "with a softcap, 2 with ALiBi slopes, 3 with both (windows and sinks are read at run time); one "
                    "cubin, its entry points launched in the order of 'launch' (flash_bwd_dsinks only with sinks)",
    }


def check_out(out_dir: str | os.PathLike, archs: Sequence[str] = ()) -> Path:
    """Create ``out_dir`` and prove it writable, before anything compiles: OutDirError names why not
    (a file in the way, no permission, a read-only file system)."""
    out = Path(out_dir)
    try:
        if out.exists() and not out.is_dir():
            raise OutDirError(f"{out}: exists and is not a directory")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutDirError(f"{out}: cannot be created ({e.strerror or e})") from None
    for sub in ("include", "examples", *archs):
        if (out / sub).exists() and not (out / sub).is_dir():
            raise OutDirError(f"{out / sub}: is in the way (the export writes a directory there)")
    if (out / "manifest.json").is_dir():
        raise OutDirError(f"{out / 'manifest.json'}: is a directory (the export writes a file there)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".cudattn-export-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutDirError(f"{out}: not writable ({e.strerror or e})") from None
    return out


def _earlier(out: Path, fresh: dict) -> tuple[dict | None, str | None]:
    """The manifest an earlier export left in ``out`` (None if none or unreadable) and, when its
    targets cannot be listed with this export's, why (cubins and tables must come from one build)."""
    path = out / "manifest.json"
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{path} is unreadable ({e})"
    if not isinstance(old, dict) or not isinstance(old.get("archs"), dict):
        return None, f"{path} is not a cudattn export manifest"
    differs = [k for k in ("format", "cudattn", "commit", "structs", "rules") if old.get(k) != fresh[k]]
    if differs:
        return old, (f"{path} was written by another build (cudattn {old.get('cudattn')}, commit "
                     f"{old.get('commit')}; {', '.join(differs)} differ)")
    return old, None


def _listed(manifest: dict | None) -> set[tuple[str, str]]:
    """(arch, file) of every cubin a manifest lists, of the names an export writes only."""
    found = set()
    for arch, entry in ((manifest or {}).get("archs") or {}).items():
        for k in (entry.get("kernels") or []) if isinstance(entry, dict) else []:
            name = k.get("file") if isinstance(k, dict) else None
            if arch in _kernels.ARCHS and isinstance(name, str) and re.fullmatch(r"[a-z0-9_.]+\.cubin", name):
                found.add((arch, name))
    return found


def _write_text(path: Path, text: str) -> None:
    """Replace ``path`` whole (a temp file renamed over it): a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def export(out_dir: str | os.PathLike, archs: Sequence[str] = ("sm_90a",), *, jobs: int | None = None,
           cache=None, progress: bool = True) -> dict:
    """Write the export for ``archs`` into ``out_dir`` (created; existing files of the same names are
    replaced; the targets of an earlier export there by the same build stay listed). Returns the
    manifest."""
    from . import warm as _warm
    from ..bench.manifest import git_commit

    archs = list(dict.fromkeys(archs))
    for arch in archs:
        if arch not in _traits.ARCH_SMEM_LIMIT:
            raise ExportError(f"unknown compile target {arch!r}; cudattn builds for {', '.join(_kernels.ARCHS)}")
    out = check_out(out_dir, archs)
    manifest: dict = {
        "format": FORMAT, "cudattn": __version__, "id": None, "commit": git_commit(),
        "nvrtc": ".".join(map(str, nvrtc_cache.nvrtc_version())),
        "structs": {_cabi.c_name(name): {"kernel_name": name, **_cabi.layout(cls)} for cls, name in _cabi.STRUCTS},
        "rules": _rules(), "archs": {},
    }
    old, why_not = _earlier(out, manifest)
    kept = {} if old is None or why_not else {a: e for a, e in old["archs"].items()
                                              if a in _kernels.ARCHS and a not in archs}
    gone = sorted(a for a, e in kept.items() if not all((out / a / k["file"]).is_file() for k in e["kernels"]))
    if gone:  # deleted by hand since: listing them would hand the C launcher missing files
        why_not, kept = f"{out} lacks files its manifest lists", {a: e for a, e in kept.items() if a not in gone}
    dropped = sorted(a for a in ((old or {}).get("archs") or {}) if a not in archs and a not in kept)
    if why_not and (dropped or old is None):
        print(f"note: {why_not}: " + (f"its {', '.join(dropped)} kernels are not kept (export them again with "
              f"{' '.join('--arch ' + a for a in dropped)})" if dropped else "it is replaced"), file=sys.stderr)
    report = _warm.warm(archs, jobs=jobs, cache=cache, progress=progress)  # one pool for every arch
    if report.failed:
        raise ExportError(f"{len(report.failed)} kernels failed to compile: {report.failed[0][0]}: "
                          f"{report.failed[0][1]}")
    written: dict[str, dict] = {}
    for arch in archs:
        (out / arch).mkdir(parents=True, exist_ok=True)
        kernels: list[dict] = []
        files: dict[tuple, str] = {}
        for spec in _catalog.all_kernels(arch):
            res = _kernels.compile_variant(spec, arch, cache=cache)
            kind = _kind(spec)
            name = _file_name(spec, kind)
            if name in files.values():
                raise ExportError(f"two builds would share {name}")
            files[_build_key(spec)] = name
            (out / arch / name).write_bytes(res.cubin)
            # the entry from ptxas's report; the kernel's name when the stored report lists none
            # (seen on the GPU machine for some decode builds read back from the cache)
            entries = sorted(k for k, r in res.ptxas.items() if r.entry) or [spec.kernel_name]
            launch = _launch(spec)
            kernels.append({
                "file": name, "kind": kind, "family": spec.family, "source": spec.source, "entries": entries,
                "options": _kernels.options_for(spec), "threads": spec.threads, "dynamic_smem": spec.smem_bytes,
                "ptxas": {e: dataclasses.asdict(res.ptxas[e]) for e in entries if e in res.ptxas},
                "select": _selection_inputs(spec), "sha256": hashlib.sha256(res.cubin).hexdigest(),
                **({"launch": launch} if launch else {}),
            })
        written[arch] = {"kernels": kernels, "selection": _selection_table(arch, files),
                         "smem_limit": _traits.ARCH_SMEM_LIMIT[arch]}
    merged = {**kept, **written}
    manifest["archs"] = {a: merged[a] for a in _kernels.ARCHS if a in merged}  # one order, whatever was given
    # One fingerprint of every cubin listed: the C launcher compiled against this export's tables
    # refuses any other export, even one of the same cudattn version (re-tuned tiles change the table).
    digest = hashlib.sha256()
    for arch, entry in manifest["archs"].items():
        for k in entry["kernels"]:
            digest.update(f"{arch}/{k['file']}:{k['sha256']}\n".encode())
    manifest["id"] = digest.hexdigest()[:32]
    inc = out / "include"
    inc.mkdir(parents=True, exist_ok=True)
    _write_text(inc / "cudattn_params.h", _cabi.header(__version__, FORMAT))
    _write_text(inc / "cudattn_kernels.h", kernel_table_header(manifest))
    for name in HEADERS:
        _write_text(inc / name, _export_file(name))
    (out / "examples").mkdir(exist_ok=True)
    _write_text(out / "examples" / "attention.c", _export_file("attention.c"))
    _write_text(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    for arch, name in sorted(_listed(old) - _listed(manifest)):  # what no manifest lists any more
        (out / arch / name).unlink(missing_ok=True)
        if (out / arch).is_dir() and not any((out / arch).iterdir()):
            (out / arch).rmdir()
    return manifest


def _export_file(name: str) -> str:
    """A file the export copies as it is (package data in cu_src/export): the launcher, the example."""
    return _kernels.source_root().joinpath("export", name).read_text(encoding="utf-8")


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
