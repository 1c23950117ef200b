"""The ``py.typed`` markers are truthful: every public callable is fully annotated.

Public, found by introspection (so a new export is checked without editing this file):

- ``cudattn.__all__``: its functions, and for its classes defined in cudattn the ``__init__`` and
  the public (non-underscore) methods and properties defined in the class itself;
- every public function defined in ``cudattn.reference`` (the package or one of its modules);
- ``nvrtc_cache.__all__``, by the same rules (dataclasses: their generated ``__init__``).

Each must annotate every parameter (``self`` / ``cls`` aside; ``*args`` / ``**kwargs`` too) and
its return. One exception, PEP 484's: an ``__init__`` with an annotated parameter may leave out
``-> None`` (type checkers read it as typed). Overloads (``typing.get_overloads``, Python 3.11+)
are held to the same rule, and every annotation must resolve with ``typing.get_type_hints``
(no name that exists only under ``TYPE_CHECKING``). No GPU and no mypy needed.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from pathlib import Path

import pytest

import cudattn
import nvrtc_cache
from cudattn import reference
from cudattn._arrays import array as _array
from cudattn._arrays import types as _types


def _class_members(cls: type, prefix: str) -> list[tuple[str, typing.Callable[..., object], bool]]:
    """(name, function, is_method) for ``__init__`` and the public methods/properties of ``cls``'s own dict."""
    out = []
    for name, attr in vars(cls).items():
        if name != "__init__" and name.startswith("_"):
            continue
        qual = f"{prefix}.{name}"
        if isinstance(attr, staticmethod):
            out.append((qual, attr.__func__, False))
        elif isinstance(attr, classmethod):
            out.append((qual, attr.__func__, True))
        elif isinstance(attr, property):
            for part, fn in (("fget", attr.fget), ("fset", attr.fset)):
                if fn is not None:
                    out.append((f"{qual}.{part}", fn, True))
        elif isinstance(attr, functools.cached_property):
            out.append((qual, attr.func, True))
        elif inspect.isfunction(attr):
            out.append((qual, attr, True))
    return out


def _exports(module: typing.Any, package: str) -> list[tuple[str, typing.Callable[..., object], bool]]:
    out = []
    for name in module.__all__:
        obj = getattr(module, name)
        qual = f"{module.__name__}.{name}"
        if inspect.isclass(obj):
            if obj.__module__.split(".")[0] == package:
                out += _class_members(obj, qual)
        elif callable(obj) and not inspect.ismodule(obj):
            out.append((qual, obj, False))
    return out


def _public_callables() -> list[tuple[str, typing.Callable[..., object], bool]]:
    found = _exports(cudattn, "cudattn") + _exports(nvrtc_cache, "nvrtc_cache")
    for name, obj in vars(reference).items():
        defined_there = inspect.isfunction(obj) and f"{obj.__module__}.".startswith(f"{reference.__name__}.")
        if not name.startswith("_") and defined_there:
            found.append((f"cudattn.reference.{name}", obj, False))
    return found


PUBLIC = _public_callables()


def _missing(fn: typing.Callable[..., object], qual: str, is_method: bool) -> list[str]:
    """What ``fn``'s signature leaves unannotated, as readable lines."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if is_method and params and params[0].name in ("self", "cls"):
        params = params[1:]
    problems = [f"parameter {p.name!r}" for p in params if p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        init_ok = qual.endswith(".__init__") and any(p.annotation is not inspect.Parameter.empty for p in params)
        if not init_ok:
            problems.append("the return")
    return problems


def test_finds_the_public_api():
    """The introspection above really reaches each kind of public callable."""
    names = {qual for qual, _, _ in PUBLIC}
    for expected in (
        "cudattn.attention",
        "cudattn.attention_with_kvcache",
        "cudattn.merge_attention_states",
        "cudattn.quantize_fp8",
        "cudattn.dequantize",
        "cudattn.to_device",
        "cudattn.to_host",
        "cudattn.empty_cache",
        "cudattn.DeviceArray.__init__",
        "cudattn.DeviceArray.copy_to_host",
        "cudattn.DeviceArray.nbytes.fget",
        "cudattn.CudaError.__init__",
        "cudattn.OutOfMemoryError.__init__",
        "cudattn.reference.attention",
        "cudattn.reference.check_close_fp8",
        "cudattn.reference.merge_attention_states",
        "nvrtc_cache.compile",
        "nvrtc_cache.nvrtc_version",
        "nvrtc_cache.parse_ptxas",
        "nvrtc_cache.Cache.compile",
        "nvrtc_cache.CompileResult.__init__",
        "nvrtc_cache.PtxasReport.__init__",
    ):
        assert expected in names, f"{expected} was not found among the public callables"


@pytest.mark.parametrize("qual, fn, is_method", PUBLIC, ids=[q for q, _, _ in PUBLIC])
def test_annotated(qual: str, fn: typing.Callable[..., object], is_method: bool) -> None:
    variants = [("", fn)]
    if sys.version_info >= (3, 11):
        variants += [(f" (overload {i})", o) for i, o in enumerate(typing.get_overloads(inspect.unwrap(fn)), 1)]
    problems = [f"{qual}{which}: {what} has no annotation"
                for which, f in variants for what in _missing(f, qual, is_method)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("qual, fn, is_method", PUBLIC, ids=[q for q, _, _ in PUBLIC])
def test_annotations_resolve(qual: str, fn: typing.Callable[..., object], is_method: bool) -> None:
    """Each annotation names something importable at run time (get_type_hints evaluates them)."""
    typing.get_type_hints(inspect.unwrap(fn))
    if sys.version_info >= (3, 11):
        for o in typing.get_overloads(inspect.unwrap(fn)):
            typing.get_type_hints(o)


def test_return_lse_overloads():
    """attention / attention_with_kvcache: return_lse=True is typed as a pair, False as one array."""
    if sys.version_info < (3, 11):
        pytest.skip("typing.get_overloads needs Python 3.11")
    for fn in (cudattn.attention, cudattn.attention_with_kvcache):
        returns = {}
        for o in typing.get_overloads(fn):
            hints = typing.get_type_hints(o)
            returns[hints["return_lse"]] = hints["return"]
        assert typing.get_origin(returns[typing.Literal[True]]) is tuple
        assert returns[typing.Literal[False]] == _array.ArrayResult
        assert bool in returns, f"{fn.__name__}: no overload for a plain bool return_lse"


def test_py_typed_markers():
    for package in (cudattn, nvrtc_cache):
        assert (Path(package.__file__).parent / "py.typed").is_file()


def test_the_checker_catches_gaps():
    """_missing reports what it should (a guard against a check that passes everything)."""

    def bare(a, *args, b: int = 0, **kwargs):
        pass

    class C:
        def __init__(self, x: int):
            pass

        def m(self):
            pass

    assert _missing(bare, "f", False) == ["parameter 'a'", "parameter 'args'", "parameter 'kwargs'", "the return"]
    assert _missing(C.__init__, "C.__init__", True) == []
    assert _missing(C.m, "C.m", True) == ["the return"]
