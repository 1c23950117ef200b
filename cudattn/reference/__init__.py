"""NumPy reference for `cudattn.attention`, and the correctness rule GPU results are held to.

- `attention`: float64, exactly the API's semantics (layouts, GQA/MQA, bottom-right causal,
  empty rows → output 0 / LSE -inf). The ground truth ("ref").
- `attention_naive`: the same math in the input's low precision, as a straightforward GPU
  implementation would do it (fp32 accumulation, probabilities and output rounded to the
  dtype). FlashAttention's "naive" baseline: it measures how much error the dtype alone costs.
- `check_close`: FlashAttention's rule, ``max|out − ref| ≤ 2·max|naive − ref| + atol``,
  with NaN never passing.
- KV cache (decode): `kvcache_append` (write new tokens into copies of a contiguous or paged
  cache), `gather_kv` (each sequence's valid keys as contiguous arrays), and
  `attention_with_kvcache` / `attention_with_kvcache_naive`, which run `attention` /
  `attention_naive` per sequence over its gathered keys.
- `attention_backward`: exact float64 gradients (dq, dk, dv, and the sinks' own) of `attention`
  or of a packed batch, under every score modifier; `attention_backward_naive`, the same in the
  inputs' 16-bit dtype, the baseline of `check_close` for gradients.
- `merge_attention_states`: combine partial results ``(out_s, lse_s)`` over disjoint key sets
  (split-KV) into the result over their union, in float64.
- FP8 (e4m3): `attention` and `attention_naive` take FlashAttention-3's ``q/k/v_descale``
  (None, a float, or a ``(B, Hkv)`` array) and then work on the dequantised inputs
  ``x.astype(float64) * descale``; `quantize_fp8` / `dequantize` are the NumPy quantiser;
  `attention_fp8_emulated` does the FP8 kernels' arithmetic in NumPy (tile by tile, P rounded to
  e4m3); `error_stats` and `check_close_fp8` are the FP8 accuracy metrics and correctness rule.

Causal masking is aligned to the bottom right (FlashAttention ≥ 2.1): query ``i`` sees key
``j`` iff ``j <= i + Sk - Sq``. torch SDPA's ``is_causal`` aligns to the top left instead;
the two agree only when ``Sq == Sk``.

Memory: work is done one (batch, query head) at a time, in blocks of query rows, so at most
one block of one head's score matrix (about 4 Mi scores, 32 MiB in float64) is held at once.

Modules (the public names above are all re-exported here, ``cudattn.reference.<name>``):
`dense` (`attention`, `attention_naive` and their score-modifier path), `backward`, `varlen`, `kvcache`,
`merge`, `fp8` (quantiser, e4m3 rounding, emulated FP8 attention) and `rule` (`check_close`,
`gradient_eps`, `error_stats`, `check_close_fp8`).
"""

from __future__ import annotations

from .backward import attention_backward, attention_backward_naive
from .dense import attention, attention_naive
from .fp8 import E4M3_MAX, attention_fp8_emulated, dequantize, quantize_fp8
from .kvcache import (
    attention_with_kvcache,
    attention_with_kvcache_naive,
    gather_kv,
    kvcache_append,
)
from .merge import merge_attention_states
from .rule import (
    FP8_MAX_FACTOR,
    FP8_MAX_FLOOR,
    FP8_RMSE_FACTOR,
    FP8_RMSE_FLOOR,
    check_close,
    check_close_fp8,
    error_stats,
    gradient_eps,
)
from .varlen import attention_varlen

__all__ = [
    "attention",
    "attention_backward",
    "attention_backward_naive",
    "attention_naive",
    "attention_varlen",
    "check_close",
    "gradient_eps",
    "kvcache_append",
    "gather_kv",
    "attention_with_kvcache",
    "attention_with_kvcache_naive",
    "merge_attention_states",
    "quantize_fp8",
    "dequantize",
    "attention_fp8_emulated",
    "error_stats",
    "check_close_fp8",
    "E4M3_MAX",
    "FP8_MAX_FACTOR",
    "FP8_RMSE_FACTOR",
    "FP8_MAX_FLOOR",
    "FP8_RMSE_FLOOR",
]
