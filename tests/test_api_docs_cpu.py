"""The public API documents itself: ``help(cudattn)`` lists every public name, each public function
has a NumPy-style docstring (summary, Parameters, Returns, Raises, Examples), no public docstring
sends the reader to README sections or private modules, and the examples are valid Python (those
that need no GPU are run).
"""

from __future__ import annotations

import doctest
import inspect
import re

import numpy as np
import pytest

import cudattn
from cudattn import reference

FUNCTIONS = [n for n in cudattn.__all__ if inspect.isfunction(getattr(cudattn, n))]
CLASSES = [n for n in cudattn.__all__ if inspect.isclass(getattr(cudattn, n))]


def _sections(doc: str) -> list[str]:
    """The NumPy-style section titles of a dedented docstring (a line underlined with dashes)."""
    lines = doc.splitlines()
    return [a.strip() for a, b in zip(lines, lines[1:]) if b.strip() and set(b.strip()) == {"-"}
            and len(b.strip()) == len(a.strip())]


def _public_docs() -> list[tuple[str, str]]:
    """(qualified name, docstring) of every public function, class, method and property, and of
    the package and `cudattn.reference`."""
    out = [("cudattn", cudattn.__doc__ or ""), ("cudattn.reference", reference.__doc__ or "")]
    for name in cudattn.__all__:
        obj = getattr(cudattn, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            out.append((f"cudattn.{name}", inspect.getdoc(obj) or ""))
        if inspect.isclass(obj):
            for m, attr in vars(obj).items():
                f = attr.fget if isinstance(attr, property) else attr
                if (not m.startswith("_") or m == "__init__") and callable(f) and f.__doc__:
                    out.append((f"cudattn.{name}.{m}", inspect.getdoc(f)))
    for name in reference.__all__:
        obj = getattr(reference, name)
        if inspect.isfunction(obj):
            out.append((f"cudattn.reference.{name}", inspect.getdoc(obj) or ""))
    return out


def test_all_is_complete():
    public = {n for n, v in vars(cudattn).items() if not n.startswith("_") and not inspect.ismodule(v)
              and getattr(v, "__module__", "cudattn").startswith("cudattn")}
    assert public <= set(cudattn.__all__), f"public but not in __all__: {public - set(cudattn.__all__)}"
    assert {"attention", "attention_with_kvcache", "merge_attention_states", "quantize_fp8", "dequantize",
            "to_device", "to_host", "empty_pinned", "empty_cache", "DeviceArray", "reference"} <= set(cudattn.__all__)
    for name in cudattn.__all__:
        assert hasattr(cudattn, name), name


@pytest.mark.parametrize("name", cudattn.__all__)
def test_package_docstring_names_each_public_name(name):
    """``help(cudattn)`` shows the package docstring: each public name on a line of its own with what it is."""
    lines = [ln for ln in cudattn.__doc__.splitlines() if re.match(rf"\s+{re.escape(name)}\s+--\s+\S", ln)]
    assert len(lines) == 1, f"cudattn.__doc__ has no one-line entry '{name} -- ...'"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_docstring_is_numpy_style(name):
    doc = inspect.getdoc(getattr(cudattn, name))
    assert doc, f"cudattn.{name} has no docstring"
    first, *rest = doc.splitlines()
    assert first.strip() and (not rest or not rest[0].strip()), f"cudattn.{name}: no one-line summary"
    sections = _sections(doc)
    for title in ("Parameters", "Returns", "Raises", "Examples"):
        assert title in sections, f"cudattn.{name}'s docstring has no {title} section (has {sections})"
        assert f"\n{title}\n" in doc
    order = [s for s in sections if s in ("Parameters", "Returns", "Raises", "Notes", "Examples")]
    assert order == sorted(order, key=["Parameters", "Returns", "Raises", "Notes", "Examples"].index), order
    examples = doc.split("\nExamples\n", 1)[1]
    assert ">>> " in examples, f"cudattn.{name}: the Examples section has no >>> lines"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_raises_section_names_exception_types(name):
    doc = inspect.getdoc(getattr(cudattn, name))
    raises = doc.split("\nRaises\n", 1)[1].split("\n\n", 1)[0]
    types = re.findall(r"^([A-Za-z_.]+(?:Error|Exception)(?:, [A-Za-z_.]+Error)*)$", raises, re.M)
    assert types, f"cudattn.{name}: the Raises section names no exception type:\n{raises}"
    for line in types:
        for t in line.split(", "):
            assert t.split(".")[-1] in {"TypeError", "ValueError", "NotImplementedError", "CudaError",
                                        "NoDeviceError", "OutOfMemoryError"}, t


@pytest.mark.parametrize("name", FUNCTIONS)
def test_examples_are_valid_python(name):
    """The examples need a GPU, so they are not run here (but for the CPU-only ones below); each
    must at least compile, so that no example is a typo."""
    tests = doctest.DocTestFinder().find(getattr(cudattn, name), name, globs={})
    examples = [ex for t in tests for ex in t.examples]
    assert examples, name
    for ex in examples:
        compile(ex.source, f"<cudattn.{name} example>", "single")


@pytest.mark.parametrize("fn", [cudattn.quantize_fp8, cudattn.dequantize], ids=["quantize_fp8", "dequantize"])
def test_cpu_only_examples_run(fn):
    """NumPy input to quantize_fp8 / dequantize runs on the host: their examples run as written."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for t in doctest.DocTestFinder().find(fn, fn.__name__, globs={}):
        result = runner.run(t)
        assert result.failed == 0 and result.attempted > 0, f"{fn.__name__}'s examples failed"


def test_merge_example_runs_with_reference_parts(monkeypatch):
    """merge_attention_states's example, with `attention` standing in for the GPU by the reference
    (float64, rounded as the kernels round): the merge of the two halves is attention over all keys."""

    def attention(q, k, v, *, return_lse=False, **kw):
        o, lse = reference.attention(q, k, v, return_lse=True, **kw)
        return (o.astype(q.dtype), lse.astype(np.float32)) if return_lse else o.astype(q.dtype)

    monkeypatch.setattr(cudattn, "attention", attention)
    runner = doctest.DocTestRunner()
    fn = cudattn.merge_attention_states
    for t in doctest.DocTestFinder().find(fn, fn.__name__, globs={}):
        result = runner.run(t)
        assert result.failed == 0 and result.attempted > 0


_REFERS_AWAY = re.compile(r"README|module doc|see the module|`_[a-z]\w*`|cudattn\._[a-z]")


@pytest.mark.parametrize("qual, doc", _public_docs(), ids=[q for q, _ in _public_docs()])
def test_no_public_docstring_refers_to_readme_or_private_modules(qual, doc):
    bad = [ln.strip() for ln in doc.splitlines() if _REFERS_AWAY.search(ln)]
    assert not bad, f"{qual}'s docstring refers the reader away (say the thing itself): {bad}"


def test_attention_docstring_says_fp8_kv_caches_exist():
    doc = cudattn.attention.__doc__
    assert "no KV cache" not in doc and "KV cache yet" not in doc
    assert "attention_with_kvcache" in doc  # FP8 KV caches are its business
    assert "FP8" in cudattn.attention_with_kvcache.__doc__
