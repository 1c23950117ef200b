"""CPU: the parts of `python -m cudattn selfcheck` that need no GPU: the case lists and the checks
(fed results made from the reference, then broken). How it runs (sanitizers, command line,
counter, reports) is in test_selfcheck_run_cpu.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cudattn import reference
from cudattn._selfcheck import _cases, _check, _exec, _inputs

ALL_CASES = _cases.selfcheck_cases() + _cases.sanitize_cases() + _cases.load_cases(40)
HOPPER, FP8_ARCHS = ("sm_90a",), ("sm_89", "sm_90a", "sm_90")


# ---------------------------------------------------------------------- case lists


def test_case_names_are_unique_and_seeds_stable():
    for cases in (_cases.selfcheck_cases(), _cases.sanitize_cases(), _cases.load_cases(40)):
        names = [c.name for c in cases]
        assert len(set(names)) == len(names)
    c = _cases.selfcheck_cases()[0]
    assert c.seed == _cases.Case(**{f: getattr(c, f) for f in c.__dataclass_fields__}).seed


def test_selfcheck_cases_cover_what_the_issue_asks():
    cases = _cases.selfcheck_cases()
    groups = {c.group for c in cases}
    assert {"portable", "hopper", "fp8-portable", "fp8-hopper", "decode", "kvcache", "merge", "quantize"} <= groups
    prefill = [c for c in cases if c.op == "attention" and not c.decode]
    assert {1, 65, 113, 203} <= {c.Sk for c in prefill} | {c.Sq for c in prefill}
    assert any(c.causal and c.Sq > c.Sk for c in prefill), "fully masked rows"
    assert any(c.causal and c.Sq > c.Sk for c in cases if c.decode), "fully masked rows in decode"
    assert any(c.Hkv == 1 and c.Hq > 1 for c in prefill) and any(1 < c.Hkv < c.Hq for c in prefill), "MQA and GQA"
    assert {"bshd", "bhsd"} <= {c.layout for c in prefill}
    for fam in ("portable", "hopper"):
        fp8 = [c for c in prefill if c.fp8 and c.family == fam]
        assert {"device", "host"} <= {c.quant for c in fp8}
    splits = {c.num_splits for c in cases if c.decode or c.op == "kvcache"}
    assert {2, 3, 4, None} <= splits and all(c.Sq <= 16 for c in cases if c.decode)
    kv = [c for c in cases if c.op == "kvcache"]
    assert any(c.page_size for c in kv) and any(not c.page_size for c in kv) and any(c.s_new for c in kv)
    assert any(not c.lse for c in cases) and any(c.lse for c in cases)
    assert any(c.host for c in cases), "the NumPy path"
    # every portable head-dim tile (32, 64, 128, 192, 256) and a padded one
    dims = {c.D for c in prefill if c.family == "portable" and not c.fp8}
    assert {32, 64, 128, 192, 256} <= dims and dims - {32, 64, 128, 192, 256}


def test_sanitize_list_is_short_and_covers_each_path():
    cases = _cases.sanitize_cases()
    assert len(cases) <= 10
    assert {"portable", "hopper", "fp8-portable", "fp8-hopper", "decode", "kvcache", "merge", "quantize"} == \
        {c.group for c in cases}


def test_load_mix_covers_every_op_even_when_short():
    for n in (11, 40):
        cases = _cases.load_cases(n, seed=3)
        assert len(cases) == n
        assert {"prefill", "fp8-prefill", "decode", "kvcache", "merge", "quantize"} <= {c.group for c in cases}
        assert any(c.host for c in cases)
        assert all(c.family == "any" for c in cases), "load threads share one kernel family"
        assert not any(c.fp8 and c.quant == "device" for c in cases), "building the pool must not run kernels"
    assert [c.name for c in _cases.load_cases(40, 5)] == [c.name for c in _cases.load_cases(40, 5)]


def test_skip_reasons():
    hop = _cases.Case("attention", "float16", Sq=65, Sk=65, family="hopper")
    fp8 = _cases.Case("attention", "float8_e4m3fn", Sq=65, Sk=65, quant="host")
    assert hop.skip_reason("sm_90a", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS) is None
    assert "Hopper" in hop.skip_reason("sm_80", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS)
    assert fp8.skip_reason("sm_89", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS) is None
    assert "FP8" in fp8.skip_reason("sm_86", hopper_archs=HOPPER, fp8_archs=FP8_ARCHS)


@pytest.mark.parametrize("kw, match", [
    (dict(op="nope"), "op must be"),
    (dict(Hq=3, Hkv=2), "multiple"),
    (dict(dtype="float8_e4m3fn"), "quant="),
    (dict(op="kvcache", B=2, seqlens=(1,)), "seqlens"),
    (dict(op="kvcache", Sk=64, seqlens=(63,), s_new=2), "overflow"),
    (dict(op="kvcache", Sk=64, seqlens=(1,), page_size=24), "page_size"),
    (dict(op="merge"), "parts"),
])
def test_bad_cases_are_refused(kw, match):
    base = dict(op="attention", dtype="float16")
    with pytest.raises(ValueError, match=match):
        _cases.Case(**{**base, **kw})


def test_inputs_are_seeded_and_never_zero():
    for c in _cases.selfcheck_cases():
        a, b = _inputs.make_inputs(c), _inputs.make_inputs(c)
        for k, x in a.items():
            if x is None:
                continue
            assert x.tobytes() == b[k].tobytes()
            if k in ("q", "k", "v", "x"):
                assert np.count_nonzero(x.astype(np.float32)) > 0.9 * x.size


def test_kvcache_inputs_page_table_is_a_permutation():
    c = _cases.Case("kvcache", "float16", 3, 1, 256, 4, 1, 64, seqlens=(1, 2, 3), page_size=16)
    inp = _inputs.make_inputs(c)
    t = inp["table"]
    assert t.shape == (3, 16) and t.dtype == np.int32 and len(set(t.ravel())) == t.size
    assert inp["k_cache"].shape == (3 * 16 + 2, 16, 1, 64)


# ---------------------------------------------------------------------- checks with made-up results


def _ref_results(c: _cases.Case, inputs: dict) -> tuple[dict, dict, int]:
    """(ref, got, block_n) as a correct GPU run would give them, made on the CPU from the reference."""
    if c.op == "attention" and not c.fp8:
        r, rl = reference.attention(inputs["q"], inputs["k"], inputs["v"], causal=c.causal, layout=c.layout,
                                    return_lse=True)
        return dict(inputs), {"out": r.astype(_exec.out_dtype(c)), "lse": rl.astype(np.float32) if c.lse else None}, 128
    if c.op == "attention":
        import cudattn

        names = ("q", "k", "v")
        quant = [cudattn.quantize_fp8(inputs[n], per=c.per, layout=c.layout, heads_kv=c.Hkv) for n in names]
        ref = dict(zip(names, (q for q, _ in quant)))
        ref["descales"] = {f"{n}_descale": d for n, (_, d) in zip(names, quant)}
        out_dt = _inputs.DTYPES[c.out_dtype] if c.out_dtype else None
        emu, el = reference.attention_fp8_emulated(ref["q"], ref["k"], ref["v"], causal=c.causal, layout=c.layout,
                                                   out_dtype=out_dt, return_lse=True, block_n=64, **ref["descales"])
        return ref, {"out": emu, "lse": el if c.lse else None}, 64
    if c.op == "kvcache":
        kw = dict(cache_seqlens=inputs["seqlens"], block_table=inputs["table"], k_new=inputs["k_new"],
                  v_new=inputs["v_new"], causal=c.causal)
        r, rl = reference.attention_with_kvcache(inputs["q"], inputs["k_cache"], inputs["v_cache"], **kw,
                                                 return_lse=True)
        kc, vc = (reference.kvcache_append(inputs["k_cache"], inputs["v_cache"], inputs["k_new"], inputs["v_new"],
                                           inputs["seqlens"], inputs["table"]) if c.s_new
                  else (inputs["k_cache"], inputs["v_cache"]))
        return dict(inputs), {"out": r.astype(inputs["q"].dtype), "lse": rl.astype(np.float32) if c.lse else None,
                              "k_cache": kc, "v_cache": vc}, 128
    if c.op == "merge":
        o, l = reference.merge_attention_states(list(inputs["outs"]), list(inputs["lses"]), layout=c.layout)
        return dict(inputs), {"out": o.astype(inputs["outs"].dtype), "lse": l.astype(np.float32)}, 128
    import cudattn

    x8, d = cudattn.quantize_fp8(inputs["x"], per=c.per, layout=c.layout, heads_kv=c.Hkv)
    return dict(inputs), {"x8": x8, "descale": d}, 128


_CHECK_CASES = _cases.sanitize_cases() + [c for c in _cases.selfcheck_cases() if c.op in ("kvcache", "merge",
                                                                                          "quantize")] + [
    _cases.selfcheck_cases()[2],  # Sq > Sk: empty rows, LSE -inf
    next(c for c in _cases.selfcheck_cases() if c.fp8 and c.out_dtype == "float16"),
]


@pytest.mark.parametrize("case", _CHECK_CASES, ids=lambda c: c.name)
def test_check_passes_correct_results(case):
    ref, got, bn = _ref_results(case, _inputs.make_inputs(case))
    v = _check.check(case, ref, got, bn)
    assert v.ok, v.detail


def _break(case, got) -> dict:
    """The most common real fault: one output row left as it was poisoned (NaN), or, where the
    API allocates the output itself, one row wrong."""
    got = {k: None if x is None else x.copy() for k, x in got.items()}
    if case.op == "quantize":
        got["x8"].reshape(-1)[7] = got["x8"].dtype.type(3.0) if got["x8"].reshape(-1)[7] != 3.0 else 0.5
        return got
    o = got["out"]
    if case.op == "merge":
        o[(0,) * (o.ndim - 1)] += o.dtype.type(0.5)
    else:
        o[(-1,) * (o.ndim - 1)] = np.nan
    return got


@pytest.mark.parametrize("case", _CHECK_CASES, ids=lambda c: c.name)
def test_check_fails_broken_results(case):
    ref, got, bn = _ref_results(case, _inputs.make_inputs(case))
    v = _check.check(case, ref, _break(case, got), bn)
    assert not v.ok


def test_check_fails_a_wrong_lse_and_a_wrong_cache_append():
    c = next(c for c in _cases.selfcheck_cases() if c.op == "kvcache" and c.s_new)
    ref, got, _ = _ref_results(c, _inputs.make_inputs(c))
    bad = dict(got, lse=got["lse"] + np.float32(1e-2))
    assert "LSE" in _check.check(c, ref, bad).detail
    bad = dict(got, k_cache=ref["k_cache"])  # the append never happened
    assert "k_cache" in _check.check(c, ref, bad).detail
    empty = _cases.selfcheck_cases()[2]
    ref, got, _ = _ref_results(empty, _inputs.make_inputs(empty))
    lse = got["lse"].copy()
    lse[np.isneginf(lse)] = 0.0  # an empty row must be -inf, not 0
    assert "-inf" in _check.check(empty, ref, dict(got, lse=lse)).detail


def test_check_fails_the_wrong_shape_and_fp8_outputs_of_the_wrong_dtype():
    c = _cases.sanitize_cases()[0]
    ref, got, _ = _ref_results(c, _inputs.make_inputs(c))
    assert "shape" in _check.check(c, ref, dict(got, out=got["out"][:, :-1])).detail
    f = next(c for c in _cases.sanitize_cases() if c.fp8)
    ref, got, bn = _ref_results(f, _inputs.make_inputs(f))
    assert "expected" in _check.check(f, ref, dict(got, out=got["out"].astype(np.float16)), bn).detail


def test_first_difference():
    a = {"out": np.arange(6, dtype=np.float16).reshape(2, 3), "lse": None}
    assert _check.first_difference(a, {"out": a["out"].copy(), "lse": None}) is None
    b = a["out"].copy()
    b[1, 2] = 9
    diff = _check.first_difference(a, {"out": b, "lse": None})
    assert "1 of 6" in diff and "(1, 2)" in diff
    nan = np.full(3, np.nan, ml_dtypes.bfloat16)
    assert _check.first_difference({"x": nan}, {"x": nan.copy()}) is None, "same NaN bits are the same result"
    assert "instead of" in _check.first_difference(a, {"out": b[:1], "lse": None})
