"""The validated description of one attention call: what `_validate` produces and `_plan` consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorGeom:
    """Element strides of a q/k/v/out tensor, always in (batch, seq, head) order whatever the layout.

    The last (head-dim) axis has unit stride by contract, so it is not stored.
    """

    batch: int
    seq: int
    head: int


@dataclass(frozen=True)
class Problem:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: np.dtype  # input dtype (float16 or ml_dtypes.bfloat16)
    out_dtype: np.dtype
    layout: str  # "bshd" or "bhsd"
    causal: bool
    scale: float
    return_lse: bool
    host: bool  # True: NumPy in / NumPy out
    q_strides: TensorGeom
    k_strides: TensorGeom
    v_strides: TensorGeom
    out_strides: TensorGeom | None = None  # strides of a caller-given `out`; None: cudattn allocates

    @property
    def group_size(self) -> int:
        return self.heads_q // self.heads_kv
