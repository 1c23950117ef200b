"""The device path of `cudattn.merge_attention_states`: the ``split_kv_combine`` kernel over the parts,
whose math (`combine.cuh`) is the one the split-KV decode kernel merges its partials with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._arrays import array as _array
from .._runtime import device as _device
from .._runtime import launch as _launch
from .._spec.geometry import TensorGeom, contiguous_geom
from .._spec.merge import parse_merge_inputs
from .._spec.tensors import tensor_geom
from . import decode_traits as _decode_traits
from . import registry as _kernels
from .params import MERGE_MAX_TABLE, CombineParams
from .traits import DTYPE_NAMES

__all__ = ["launch_combine", "merge_device"]

_F32 = np.dtype(np.float32)

_COMBINE_ROWS_PER_BLOCK = 4  # one warp per output row, 128 threads


def merge_device(outs_d, lses_d, layout: str, sref):
    """The device path on adapted parts, on the call path's stream ``sref``."""
    device_id = (outs_d if isinstance(outs_d, _array.DeviceArray) else outs_d[0]).device_id
    parts_o, parts_l, B, Sq, H, D, dtype = parse_merge_inputs(outs_d, lses_d, layout)
    n = len(parts_o)
    if D % 4 or D > 256:  # the kernel moves 4 elements a lane, 2 chunks of 128 at most
        raise ValueError(f"merge_attention_states on device takes a head_dim that is a multiple of 4 up to 256 "
                         f"(attention's outputs are); got {D}")
    if B * H * Sq >= 1 << 31:  # the kernel counts rows in 32 bits
        raise ValueError(f"merge_attention_states on device takes fewer than 2**31 rows (batch x heads x "
                         f"seqlen_q); got {B * H * Sq}: merge in pieces")
    for name, group in (("outs", parts_o), ("lses", parts_l)):
        for i, a in enumerate(group):
            if a.device_id != device_id:
                raise ValueError(f"{name}[{i}] is on device {a.device_id}, outs[0] on {device_id}")
    o_geoms = [tensor_geom(f"outs[{i}]", a.shape, a.strides, a.itemsize, a.ptr, layout) for i, a in enumerate(parts_o)]
    l_strides = [_lse_strides(a, i) for i, a in enumerate(parts_l)]
    if len(set(o_geoms)) != 1 or len(set(l_strides)) != 1:
        raise ValueError("merge_attention_states: device parts must share their strides (all outs alike, all lses "
                         "alike); make them contiguous or stack them")
    # Stacked arrays give a part stride of their own. Separate parts go in the pointer table, whose
    # entries are the parts' addresses: a part stride taken from the distance between separately
    # allocated parts would depend on where they happen to lie, which a replayed call cannot know
    # (more than the table holds: the caller runs every such call on the full path).
    for name, x in (("outs", outs_d), ("lses", lses_d)):
        if isinstance(x, _array.DeviceArray) and x.shape[0] > 1 and x.strides[0] <= 0:
            # a part's address below the array's would be read by a replay as another operand's
            raise ValueError(f"merge_attention_states: stacked {name} must have a positive stride along N; got "
                             f"{x.strides[0]} bytes (a reversed or broadcast view): make it contiguous")
    stacked = isinstance(outs_d, _array.DeviceArray) and isinstance(lses_d, _array.DeviceArray)
    o_step, l_step = (_even_step(parts_o), _even_step(parts_l)) if stacked or n > MERGE_MAX_TABLE else (None, None)
    if o_step is not None and l_step is not None:
        parts = PartsView(parts_o[0].ptr, parts_l[0].ptr, o_step, l_step, o_geoms[0], l_strides[0])
    elif n <= MERGE_MAX_TABLE:
        parts = PartsView(0, 0, 0, 0, o_geoms[0], l_strides[0], tuple(a.ptr for a in parts_o),
                          tuple(a.ptr for a in parts_l))
    else:
        raise ValueError(f"merge_attention_states: more than {MERGE_MAX_TABLE} device parts must be evenly spaced "
                         "in memory (one stacked array with a leading N axis)")
    device = _device.get_device(device_id)  # after the checks, which need no GPU
    shape = (B, Sq, H, D) if layout == "bshd" else (B, H, Sq, D)
    out = _array.empty_on(shape, dtype, device, sref)
    lse = _array.empty_on((B, H, Sq), _F32, device, sref)
    o_geom = contiguous_geom(Sq, H, D, layout)
    name = "float32" if dtype == _F32 else DTYPE_NAMES[dtype]
    props = _device.device_properties(device_id)
    launch_combine(parts, n, name, dtype, out.ptr, lse.ptr, o_geom, B, Sq, H, D, props, device, sref)
    return out, lse


def _lse_strides(a, i: int) -> tuple[int, int, int]:
    st = tuple(a.strides)
    if any(s % 4 or s < 0 for s in st):
        raise ValueError(f"merge_attention_states: lses[{i}] strides {st} must be non-negative multiples of 4 bytes")
    return st[0] // 4, st[1] // 4, st[2] // 4


def _even_step(parts) -> int | None:
    """Elements between consecutive parts when they are evenly spaced (a stacked array), else None."""
    if len(parts) == 1:
        return 0
    step = parts[1].ptr - parts[0].ptr
    if step <= 0 or step % parts[0].itemsize:
        return None
    if any(parts[i + 1].ptr - parts[i].ptr != step for i in range(len(parts) - 1)):
        return None
    return step // parts[0].itemsize


@dataclass(frozen=True)
class PartsView:
    """Where the parts of a merge are: O part s at ``o + s * o_part_stride`` (or ``o_table[s]``),
    its LSE at ``lse + s * lse_part_stride`` (or ``lse_table[s]``); strides in elements."""

    o: int
    lse: int
    o_part_stride: int
    lse_part_stride: int
    o_geom: TensorGeom  # (batch, seq, head) strides of each O part
    lse_strides: tuple[int, int, int]  # (batch, head, seq) strides of each LSE part
    o_table: tuple[int, ...] = ()
    lse_table: tuple[int, ...] = ()


def launch_combine(parts: PartsView, num_parts: int, in_dtype: str, out_dtype, o: int, lse: int,
                   o_geom: TensorGeom, B: int, Sq: int, H: int, D: int, props, device, sref) -> None:
    out_name = out_dtype if isinstance(out_dtype, str) else ("float32" if np.dtype(out_dtype) == _F32
                                                            else DTYPE_NAMES[np.dtype(out_dtype)])
    spec = _decode_traits.combine_kernel(in_dtype, out_name)
    kernel = _kernels.get_kernel(spec, device, props.device_id, props.arch)
    p = CombineParams()
    p.o_parts, p.lse_parts, p.o, p.lse = parts.o, parts.lse, o, lse
    p.use_table = int(bool(parts.o_table))
    for i, (a, b) in enumerate(zip(parts.o_table, parts.lse_table)):
        p.o_table[i], p.lse_table[i] = a, b
    p.o_part_stride, p.lse_part_stride = parts.o_part_stride, parts.lse_part_stride
    p.in_stride_b, p.in_stride_s, p.in_stride_h = parts.o_geom.batch, parts.o_geom.seq, parts.o_geom.head
    p.lse_stride_b, p.lse_stride_h, p.lse_stride_s = parts.lse_strides
    p.o_stride_b, p.o_stride_s, p.o_stride_h = o_geom.batch, o_geom.seq, o_geom.head
    p.batch, p.seqlen_q, p.heads, p.head_dim, p.num_parts = B, Sq, H, D, num_parts
    rows = B * H * Sq
    grid = (-(-rows // _COMBINE_ROWS_PER_BLOCK), 1, 1)
    _launch.launch(kernel, grid, (32 * _COMBINE_ROWS_PER_BLOCK, 1, 1), 0, sref.handle, p)
