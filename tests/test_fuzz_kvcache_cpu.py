"""Fuzzing the argument checks of `cudattn.attention_with_kvcache` (NumPy and device arrays,
contiguous and paged caches, lengths, page tables, appended keys); CPU only, the property and the
GPU stand-ins are `_fuzz_harness`'s.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import cudattn
from cudattn._arrays import importer as _importer
from cudattn._arrays.array import DeviceArray
from _fuzz_harness import (
    BAD_DTYPES, BF16, F16, F32, FP8, JUNK, RATES, arg, bad, fuzz, host_tensor, outcome, perturbed_shape,
)
from _fuzz_harness import _no_gpu as _no_gpu  # fixtures
from _fuzz_devices import STREAM_ARG, STREAM_JUNK, _ptrs, device_tensor


# ---------------------------------------------------------------------------------------------
# attention_with_kvcache
# ---------------------------------------------------------------------------------------------


@st.composite
def kvcache_call(draw, host: bool):
    """Keyword arguments of one attention_with_kvcache call (valid unless faults are drawn: shapes,
    dtypes, lengths and page ids out of range, shared appended pages, junk arguments)."""
    rate = draw(RATES)
    B = draw(st.sampled_from([1, 1, 2, 3]))
    Sq = draw(st.sampled_from([1, 1, 2, 16]))
    Hkv = draw(st.sampled_from([1, 2]))
    Hq = Hkv * draw(st.sampled_from([1, 2]))
    D = draw(st.sampled_from([8, 64, 64, 128]))
    if bad(draw, rate):
        D = 12
    dtype = draw(st.sampled_from([FP8, F32])) if bad(draw, rate) else draw(st.sampled_from([F16, BF16]))
    s_new = draw(st.sampled_from([0, 0, 1, 2, 5]))
    paged = draw(st.booleans())
    if paged:
        page_size = 8 if bad(draw, rate) else draw(st.sampled_from([16, 32]))
        max_pages = draw(st.sampled_from([1, 2, 3]))
        num_pages = B * max_pages + draw(st.sampled_from([0, 1, 3]))
        if bad(draw, rate):
            num_pages = draw(st.sampled_from([1, 2]))
        cache_shape = (num_pages, page_size, Hkv, D)
        capacity = page_size * max_pages
    else:
        capacity = draw(st.sampled_from([5, 16, 33]))
        cache_shape = (B, capacity, Hkv, D)
        num_pages = B
    shapes = dict(q=(B, Sq, Hq, D), k_cache=cache_shape, v_cache=cache_shape)
    if s_new:
        shapes.update(k_new=(B, s_new, Hkv, D), v_new=(B, s_new, Hkv, D))
    args = {}
    for name, shape in shapes.items():
        if host:
            mode = "contiguous"
            if bad(draw, rate):
                mode = draw(st.sampled_from(["readonly", "padded", "misaligned", "broadcast", "masked"]))
            elif name not in ("k_cache", "v_cache"):
                mode = draw(st.sampled_from(["contiguous", "contiguous", "padded", "step"]))
            dt = draw(BAD_DTYPES) if bad(draw, rate / 2) else dtype
            args[name] = host_tensor(draw(perturbed_shape(shape, rate / 2)), dt, mode)
        else:
            args[name] = draw(device_tensor(shape, dtype, rate / 2, may_broadcast=name not in ("k_cache", "v_cache")))
    if bad(draw, rate / 2):
        args.pop(draw(st.sampled_from(["k_new", "v_new", "q"])), None)
        if "q" not in args:
            args["q"] = draw(JUNK)
    # cache_seqlens (and block_table): NumPy arrays (values checked) on either path, or (device path) device arrays
    lens = [draw(st.integers(0, capacity - s_new)) if capacity >= s_new else 0 for _ in range(B)]
    if bad(draw, rate):
        lens[draw(st.integers(0, B - 1))] = draw(st.sampled_from([-1, -3, capacity - s_new + 1, capacity + 3,
                                                                   2**31 - 1]))
    seqlens = np.array(lens, np.int64)
    if bad(draw, rate / 2):
        seqlens = draw(st.sampled_from([seqlens[:-1], np.append(seqlens, 0), seqlens[None]]))
    bad_dtype = bad(draw, rate / 2)
    seqlens = seqlens.astype(draw(st.sampled_from([np.int64, np.uint32, np.float32])) if bad_dtype else np.int32)
    kinds = ["numpy"] if host else ["numpy", "device"]
    kind = draw(st.sampled_from(kinds))
    if bad(draw, rate / 2):
        kind = draw(st.sampled_from(["none", "junk"]))
    args["cache_seqlens"] = {"numpy": seqlens, "none": None, "junk": draw(JUNK),
                             "device": DeviceArray(draw(_ptrs), seqlens.shape, seqlens.dtype, device_id=0)}[kind]
    if paged:
        table = np.array(draw(st.permutations(range(num_pages)))[: B * max_pages] if num_pages >= B * max_pages
                         else [draw(st.integers(0, num_pages - 1)) for _ in range(B * max_pages)], np.int64)
        table = np.resize(table, B * max_pages).reshape(B, max_pages)
        if bad(draw, rate):
            table[draw(st.integers(0, B - 1)), draw(st.integers(0, max_pages - 1))] = draw(
                st.sampled_from([-1, num_pages, num_pages + 5, 2**31 - 1, 0]))
        if bad(draw, rate / 2):
            table = draw(st.sampled_from([table[:, :0], table.reshape(-1), table[:-1], table.T]))
        table = table.astype(draw(st.sampled_from([np.int64, np.float32])) if bad(draw, rate / 2) else np.int32)
        kind = draw(st.sampled_from(kinds))
        if bad(draw, rate / 2):
            kind = draw(st.sampled_from(["none", "junk"]))
        strides = table.strides[::-1] if bad(draw, rate) else None
        args["block_table"] = {"numpy": table, "none": None, "junk": draw(JUNK),
                               "device": DeviceArray(draw(_ptrs), table.shape, table.dtype, strides,
                                                     device_id=0)}[kind]
    elif bad(draw, rate / 2):
        args["block_table"] = np.zeros((B, 1), np.int32)
    for name, valid, junk in (
            ("causal", st.booleans(), None), ("return_lse", st.booleans(), None),
            ("scale", st.one_of(st.none(), st.floats(-10, 10)), None),
            ("num_splits", st.one_of(st.none(), st.integers(1, 128)), st.one_of(st.integers(-1, 130), JUNK)),
            ("stream", STREAM_ARG, STREAM_JUNK)):
        if draw(st.booleans()) and (name != "stream" or not host):
            args[name] = arg(draw, rate, valid, junk)
    return args


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else _importer.as_device_array(x).shape


def _kv_invariants(args) -> None:
    """What an accepted call with NumPy lengths / table promised to have checked (README, KV caches):
    each length (appended keys included) within the capacity, every page a sequence uses a page of
    the cache, and no cache slot appended to by two sequences."""
    sl, bt, kn = args.get("cache_seqlens"), args.get("block_table"), args.get("k_new")
    cache = _shape(args["k_cache"])
    paged = bt is not None
    page_size = cache[1]
    capacity = page_size * (_shape(bt)[1] if paged else 1)
    s_new = 0 if kn is None else _shape(kn)[1]
    if isinstance(sl, np.ndarray):
        lens = sl.astype(np.int64)
        assert np.all(lens >= 0) and np.all(lens + s_new <= capacity), (lens, s_new, capacity)
    if isinstance(bt, np.ndarray):
        used = np.full(bt.shape[0], capacity) if not isinstance(sl, np.ndarray) else sl.astype(np.int64) + s_new
        for b, n in enumerate(-(-used // page_size)):
            assert np.all((bt[b, :n] >= 0) & (bt[b, :n] < cache[0])), (b, bt[b], cache[0])
        if s_new and isinstance(sl, np.ndarray):
            slots = [int(bt[b, p // page_size]) * page_size + p % page_size
                     for b in range(bt.shape[0]) for p in range(int(sl[b]), int(sl[b]) + s_new)]
            assert len(slots) == len(set(slots)), "two sequences append to one cache slot"


@fuzz(300)
@given(kvcache_call(host=True))
def test_kvcache_numpy_arguments(args):
    res = outcome(cudattn.attention_with_kvcache, **args)
    if res[0] == "gpu":
        _kv_invariants(args)


@fuzz(300)
@given(kvcache_call(host=False))
def test_kvcache_device_arguments(args):
    res = outcome(cudattn.attention_with_kvcache, **args)
    if res[0] == "gpu":
        _kv_invariants(args)
