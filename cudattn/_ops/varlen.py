"""`cudattn.attention` on packed variable-length batches (FlashAttention's varlen convention).

Flow: the arguments' checks (`_varlen` for NumPy offsets; device offsets by dtype and shape
only) -> the call validated as one padded batch entry of the packed rows (`_validate`), then
re-described as B sequences -> plan -> launch of the prefill kernels, which find each sequence
through the offsets (cu_src/include/cudattn/seqlen.cuh).

Device offsets are operands of the call (their addresses, never their values, are read here),
so warm calls replay like any other; NumPy offsets are checked and uploaded on every call.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._calls import args as _args
from .._arrays import array as _array
from .._calls import call as _callpath
from .._runtime import device as _device
from .._arrays import foreign as _foreign
from .._kernels import fp8 as _fp8
from .._kernels import registry as _kernels
from .._runtime import launch as _launch
from .._kernels import plan as _plan
from .._runtime import stream as _stream
from .._arrays import host_io as _host_io
from .._arrays import transfer as _transfer
from .._spec.dtypes import FLOAT8_E4M3
from .._arrays.operands import OTHER, kind_of
from .._spec.problem import Varlen
from .._spec.geometry import TensorGeom
from .._spec.modifiers import kernel_mods
from .._spec.descales import fp8_descales
from .._spec.validate import _describe, validate
from .._spec.varlen import check_cu_seqlens, check_device_offsets, check_max_seqlen

__all__ = ["attention_varlen"]

_F32 = np.dtype(np.float32)
_NEG_INF_F32_BITS = 0xFF800000
_MAX_GRID_YZ = 65535
_NAMES = ("q", "k", "v", "out", "cu_seqlens_q", "cu_seqlens_k", "q_descale", "k_descale", "v_descale", "sinks",
          "alibi_slopes")


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale, layout,
                     return_lse, q_descale, k_descale, v_descale, out_dtype, num_splits, out, stream,
                     window_size=None, mods=(None, None, None)):
    """`cudattn.attention` with ``cu_seqlens_q``/``cu_seqlens_k`` (its docstring has the contract).
    ``mods``: its (softcap, sinks, alibi_slopes)."""
    _check_call(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, num_splits)
    flags = dict(causal=causal, scale=scale, return_lse=return_lse, out_dtype=out_dtype, window_size=window_size)
    descales = (q_descale, k_descale, v_descale)
    host = [isinstance(x, np.ndarray) for x in (q, k, v)]
    if all(host):
        return _run_host(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, descales, flags, out,
                         stream, mods)
    if any(host) or type(q) is not _array.DeviceArray and kind_of(q) == OTHER:
        _args.check_not_mixed(q, k, v)
    host_offsets = False
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if type(x) is np.ndarray:
            host_offsets = True
        elif type(x) is not _array.DeviceArray and kind_of(x) == OTHER and not _foreign.is_device_array_like(x):
            raise TypeError(f"{name} must be an int32 NumPy or device array of shape (batch + 1,); "
                            f"got {type(x).__name__}")
    # NumPy offsets are no operands: the full path checks and uploads them on every call.
    cq_obj = None if type(cu_seqlens_q) is np.ndarray else cu_seqlens_q
    ck_obj = None if type(cu_seqlens_k) is np.ndarray else cu_seqlens_k
    # Operands: six, then the descales (FP8) and sinks and slopes when given (None as placeholders).
    softcap, sinks, alibi = mods
    has_d = not (q_descale is None and k_descale is None and v_descale is None)
    has_m = sinks is not None or alibi is not None
    objs = [q, k, v, out, cq_obj, ck_obj]
    if has_d or has_m:
        objs += [_args.array_or_none(d) for d in descales]
    if has_m:
        objs += [_args.array_or_none(sinks), _args.array_or_none(alibi)]
    consumer, keep, ops, sig, unordered = _callpath.operands(objs, _NAMES, stream)
    dkey = tuple(_args.descale_key(g, a) for g, a in zip(descales, ops[6:9])) if has_d else None
    mkey = None
    if has_m or softcap is not None:
        mkey = (_callpath.tag(softcap), *(_args.descale_key(g, a) for g, a in
                                          zip((sinks, alibi), ops[9:11] if has_m else (None, None))))
    # Types join the values (True, 1 and 1.0 hash alike). NumPy offsets make the key unhashable:
    # such calls always take the full path.
    key = ("varlen", sig, (causal, scale, return_lse, out_dtype, max_seqlen_q, max_seqlen_k),
           (causal.__class__, scale.__class__, return_lse.__class__, out_dtype.__class__, max_seqlen_q.__class__,
            max_seqlen_k.__class__), dkey, (cu_seqlens_q, cu_seqlens_k) if host_offsets else None,
           None if window_size is None else _callpath.tag(window_size), mkey)

    def full(qa, ka, va, oa, cq, ck, dq=None, dk=None, dv=None, sk=None, al=None):
        device_id = qa.device_id
        for name, a in zip(_NAMES[1:], (ka, va, oa, cq, ck, dq, dk, dv, sk, al)):
            if a is not None and a.device_id != device_id:
                raise ValueError(f"{name} is on device {a.device_id} but q is on device {device_id}; "
                                 "all operands must be on one device")
        cq = cu_seqlens_q if cq is None else cq
        ck = cu_seqlens_k if ck is None else ck
        ds = tuple(g if a is None else a for g, a in zip(descales, (dq, dk, dv)))
        ms = (softcap, sinks if sk is None else sk, alibi if al is None else al)
        problem = validate_varlen(qa, ka, va, cq, ck, max_seqlen_q, max_seqlen_k, ds, flags, oa, host=False, mods=ms)
        device = _device.get_device(device_id)
        sref = _stream.StreamRef(consumer, keep)
        cq, ck = (_host_io.to_device(c, device=device, stream=sref) if isinstance(c, np.ndarray) else c
                  for c in (cq, ck))
        return run_varlen(problem, qa, ka, va, oa, cq, ck, device, device_id, sref)

    return _callpath.run(key, objs, ops, _NAMES, consumer, keep, full, tensors=4, out_index=3,
                         allocates=out is None or return_lse is True, unordered=unordered)


def _check_call(cu_q, cu_k, max_q, max_k, layout, num_splits) -> None:
    if type(max_q) is int and type(max_k) is int and max_q >= 0 and max_k >= 0 and layout == "bshd" and \
            num_splits is None and cu_q is not None and cu_k is not None:
        return  # the usual call: nothing to say
    given = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": max_q, "max_seqlen_k": max_k}
    missing = [n for n, x in given.items() if x is None]
    if missing:
        raise TypeError(f"a packed variable-length call takes cu_seqlens_q, cu_seqlens_k, max_seqlen_q and "
                        f"max_seqlen_k together (as FlashAttention's varlen functions); missing {', '.join(missing)}")
    if layout != "bshd":
        raise ValueError(f"packed variable-length inputs are (total, heads, head_dim); layout must be 'bshd', "
                         f"got {layout!r}")
    if num_splits is not None:
        raise NotImplementedError("num_splits (the split-KV decode kernel) does not take packed variable-length "
                                  "batches; pass None")
    for name, x in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        check_max_seqlen(x, name, None)


def validate_varlen(q, k, v, cu_q, cu_k, max_q, max_k, descales, flags: dict, out, *, host: bool,
                    mods=(None, None, None)):
    """The Problem of a packed call: checked as one batch entry of the packed rows by `validate`,
    then described as ``B`` sequences of at most ``max_seqlen_q``/``max_seqlen_k`` rows.
    ``mods``: (softcap, sinks, alibi_slopes), checked once the sequence count is known."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        shape = _describe(name, x, host)[0]
        if len(shape) != 3:
            total = "total_q, heads_q" if name == "q" else "total_k, heads_kv"
            raise ValueError(f"{name} must be 3-D ({total}, head_dim) in a packed variable-length call; "
                             f"got shape {tuple(shape)}")
    total_q, total_k = q.shape[0], k.shape[0]
    lengths_q = lengths_k = None
    if isinstance(cu_q, np.ndarray):
        lengths_q = np.diff(check_cu_seqlens(cu_q, "cu_seqlens_q", total_q))
        batch = len(lengths_q)
    else:
        batch = check_device_offsets(cu_q, "cu_seqlens_q", None)
    if isinstance(cu_k, np.ndarray):
        lengths_k = np.diff(check_cu_seqlens(cu_k, "cu_seqlens_k", total_k, batch))
    else:
        check_device_offsets(cu_k, "cu_seqlens_k", batch)
    max_q = check_max_seqlen(max_q, "max_seqlen_q", lengths_q)
    max_k = check_max_seqlen(max_k, "max_seqlen_k", lengths_k)
    for name, m, total in (("max_seqlen_q", max_q, total_q), ("max_seqlen_k", max_k, total_k)):
        if m == 0 and total > 0:
            raise ValueError(f"{name} is 0 but the packed tensor has {total} rows: some sequence is longer")
    fp8 = q.dtype == FLOAT8_E4M3
    q_d, k_d, v_d = descales
    if out is not None:
        o_shape = _describe("out", out, host)[0]
        if tuple(o_shape) != tuple(q.shape):
            raise ValueError(f"out must have q's shape {tuple(q.shape)} (total_q, heads_q, head_dim); got "
                             f"{tuple(o_shape)}")
    problem = validate(q[None], k[None], v[None], layout="bshd", num_splits=None, host=host,
                       q_descale=None if fp8 else q_d, k_descale=None if fp8 else k_d,
                       v_descale=None if fp8 else v_d, out=None if out is None else out[None], **flags)
    scale, ds = problem.scale, problem.descales
    if fp8:  # (batch, heads_kv) descale arrays: batch is the sequence count, known only here
        given = problem.scale if flags["scale"] is None else float(flags["scale"])  # validate checked it
        ds, scale = fp8_descales(q_d, k_d, v_d, batch, problem.heads_kv, host, given)
    if fp8 and 128 * (-(-total_k // 128) + 2 * batch) >= 2**31:  # _fp8.vt_keys: TMA takes 32-bit coordinates
        raise ValueError(f"FP8 packed keys: {total_k} keys in {batch} sequences need a V workspace row of more than "
                         f"2**31 keys; split the call")
    if fp8 and batch > _MAX_GRID_YZ:  # the V transpose's grid has a block row per sequence
        raise ValueError(f"FP8 packed batches take at most {_MAX_GRID_YZ} sequences a call; got {batch}: split the "
                         f"call")
    km = kernel_mods(*mods, batch=batch, heads_q=problem.heads_q, host=host)
    zero = lambda g: TensorGeom(0, g.seq, g.head)  # noqa: E731 (packed: no batch axis)
    return replace(problem, mods=km, batch=batch, seqlen_q=min(max_q, total_q), seqlen_k=min(max_k, total_k),
                   q_strides=zero(problem.q_strides), k_strides=zero(problem.k_strides),
                   v_strides=zero(problem.v_strides),
                   out_strides=None if problem.out_strides is None else zero(problem.out_strides),
                   descales=ds, scale=scale, varlen=Varlen(total_q, total_k))


def run_varlen(problem, qa, ka, va, oa, cu_q, cu_k, device, device_id, sref):
    """Launch one validated packed problem on device arrays; returns out (and lse) as DeviceArrays:
    out ``(total_q, Hq, D)``, lse ``(Hq, total_q)``. ``cu_k`` None: k/v are a KV cache (its
    lengths in ``problem.kv_cache``)."""
    vl = replace(problem.varlen, cu_q_ptr=cu_q.ptr, cu_k_ptr=0 if cu_k is None else cu_k.ptr)
    problem = replace(problem, varlen=vl)
    Hq, D = problem.heads_q, problem.head_dim
    if oa is None:
        oa = _array.empty_on((vl.total_q, Hq, D), problem.out_dtype, device, sref)
        o_geom = TensorGeom(0, Hq * D, D)
    else:
        o_geom = problem.out_strides
    lse = _array.empty_on((Hq, vl.total_q), _F32, device, sref) if problem.return_lse else None
    if vl.total_q == 0:
        pass  # nothing to compute
    elif problem.batch == 0 or vl.total_k == 0 and not (problem.mods and problem.mods.sinks):
        # no key (or no sequence; sinks: the kernels write LSE = sink): O = 0, LSE = -inf, as a
        _transfer.zero_fill(oa[None], stream=sref.handle)  # row that sees no key gets in the kernels
        if lse is not None:
            _transfer.memset(lse, _NEG_INF_F32_BITS, stream=sref.handle)
    else:
        props = _device.device_properties(device_id)
        plan = _plan.make_plan(problem, props)
        kernel = _kernels.get_kernel(plan.variant, device, device_id, props.arch)
        fp8_v = problem.descales is not None and vl.total_k > 0  # no keys (sinks): no V to transpose
        vt = _fp8.transpose_v(problem, va.ptr, props, device, sref) if fp8_v else None
        params = _plan.make_params(problem, plan, qa.ptr, ka.ptr, va.ptr if vt is None else vt.ptr, oa.ptr,
                                   0 if lse is None else lse.ptr, o_geom)
        _launch.launch(kernel, plan.grid, plan.block, plan.smem, sref.handle, params)
        del vt
    return (oa, lse) if problem.return_lse else oa


def _run_host(q, k, v, cu_q, cu_k, max_q, max_k, descales, flags, out, stream, mods=(None, None, None)):
    """NumPy in, NumPy out: checked, uploaded (contiguous), run, copied back; synchronous."""
    for name, x in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be an int32 NumPy array when q, k, v are NumPy arrays; got "
                            f"{type(x).__name__}")
    if out is not None and not isinstance(out, np.ndarray):
        raise TypeError("out must be a NumPy array (q, k, v are NumPy arrays)")
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    problem = validate_varlen(q, k, v, cu_q, cu_k, max_q, max_k, descales, flags, out, host=True, mods=mods)
    device = _device.get_device(None)
    device_id = _device.device_properties(device).device_id
    sref = _stream.as_stream(stream, device)
    up = lambda x: _host_io.to_device(np.ascontiguousarray(x), device=device, stream=sref)  # noqa: E731
    qa, ka, va, cq, ck = (up(x) for x in (q, k, v, cu_q, cu_k))
    if problem.descales is not None:
        d = _fp8.upload_descales(dict(zip(("q_descale", "k_descale", "v_descale"), descales)), device, sref)
        ptrs = [getattr(d[n], "ptr", 0) if isinstance(d[n], _array.DeviceArray) else 0
                for n in ("q_descale", "k_descale", "v_descale")]
        problem = replace(problem, descales=replace(problem.descales, q_ptr=ptrs[0], k_ptr=ptrs[1], v_ptr=ptrs[2]))
    if problem.mods is not None:  # NumPy sinks and slopes (checked by value) go up too
        sk, al = (None if x is None else up(x) for x in mods[1:])
        problem = replace(problem, mods=replace(problem.mods, sinks_ptr=0 if sk is None else sk.ptr,
                                                alibi_ptr=0 if al is None else al.ptr))
    problem = replace(problem, host=False, out_strides=None)
    res = run_varlen(problem, qa, ka, va, None, cq, ck, device, device_id, sref)
    o_dev, lse_dev = res if problem.return_lse else (res, None)
    o = _host_io.to_host(o_dev, stream=sref)
    if out is not None:
        out[...] = o
        o = out
    return (o, _host_io.to_host(lse_dev, stream=sref)) if problem.return_lse else o
