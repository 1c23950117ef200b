"""Packed variable-length batches and chunked prefill against a KV cache, on device arrays.

Varlen: TFLOP/s counted on the useful work (each sequence's own Sq x Sk, causal or not), on
equal lengths (compare with Prefill at the same length) and on mixed lengths from 128 to 8192,
where a padded batch would spend most of its time on padding. Chunked prefill: 2048 new query
tokens against 16 Ki cached keys (bottom-right causal), the cache contiguous or paged.
"""

from . import _common

_MIXED = (128, 256, 512, 1024, 2048, 4096, 6144, 8192)


def _require_varlen() -> None:
    import inspect

    import cudattn

    if "cu_seqlens_q" not in inspect.signature(cudattn.attention).parameters:
        raise NotImplementedError("this cudattn has no packed variable-length batches")


def _causal_pairs(sq: int, sk: int) -> int:
    """(query, key) pairs a bottom-right causal mask keeps: row i sees min(sk, max(0, i + sk - sq + 1))."""
    if sk >= sq:
        return sq * (sk - sq + 1) + sq * (sq - 1) // 2
    return sk * (sk + 1) // 2  # the first sq - sk rows see nothing


class Varlen(_common.GpuTrack):
    version = "1"  # what it measures (see _common): bump only when that changes
    # (lengths, causal): 16 heads, head dim 128, bfloat16.
    params = ([("equal_8x2048", False), ("equal_8x2048", True), ("mixed_128_to_8192", False),
               ("mixed_128_to_8192", True)],)
    param_names = ["lengths_causal"]

    def setup(self, case):
        _common.require_gpu()
        _require_varlen()
        name, causal = case
        self.lens = (2048,) * 8 if name.startswith("equal") else _MIXED
        self.causal = causal
        self.sets = _common.memo(("varlen", case), self._make_sets)

    def _make_sets(self):
        import numpy as np

        from cudattn._runtime import launch as _launch

        total, H, D = sum(self.lens), 16, 128
        cu = np.concatenate([[0], np.cumsum(self.lens)]).astype(np.int32)
        host = [_common.randn((total, H, D), "bfloat16", s) for s in range(3)] + [cu]
        sets = _common.device_sets(host, _common.rotation_count(4 * host[0].nbytes))
        self._call(*sets[0])
        _launch.synchronize()
        return sets

    def _call(self, q, k, v, cu):
        import cudattn

        m = max(self.lens)
        return cudattn.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, max_seqlen_k=m,
                                 causal=self.causal)

    def _tflops(self, ms: float) -> float:
        pairs = sum(_causal_pairs(s, s) if self.causal else s * s for s in self.lens)
        return 4.0 * pairs * 16 * 128 / ms / 1e9

    def track_useful_tflops(self, case):
        """GPU time (calls back to back); FLOPs of the sequences' own attention, no padding."""
        return self._tflops(_common.gpu_ms_per_call(self._call, self.sets))

    track_useful_tflops.unit = "TFLOP/s"

    def track_useful_tflops_as_called(self, case):
        """One call on an idle stream, the host's time included."""
        return self._tflops(_common.as_called_ms(self._call, self.sets))

    track_useful_tflops_as_called.unit = "TFLOP/s"


class ChunkedPrefill(_common.GpuTrack):
    version = "1"
    # page size (0: a contiguous cache); 2048 new tokens a sequence against 16 Ki cached keys,
    # one sequence, 32 query and 8 KV heads, head dim 128, bfloat16, causal.
    params = ([0, 16, 256],)
    param_names = ["page_size"]
    _SQ, _L, _HQ, _HKV, _D = 2048, 16384, 32, 8, 128

    def setup(self, page_size):
        _common.require_gpu()
        _common.require_api("attention_with_kvcache")
        self.page_size = page_size
        self.sets = _common.memo(("chunked", page_size), self._make_sets)

    def _make_sets(self):
        import numpy as np

        from cudattn._runtime import launch as _launch

        q = _common.randn((1, self._SQ, self._HQ, self._D), "bfloat16", 0)
        k = _common.randn((1, self._L, self._HKV, self._D), "bfloat16", 1)
        v = _common.randn((1, self._L, self._HKV, self._D), "bfloat16", 2)
        lens = np.array([self._L], np.int32)
        host = [q, k, v, lens]
        if self.page_size:
            pages = self._L // self.page_size
            order = np.random.default_rng(0).permutation(pages).astype(np.int32)
            kp, vp = (np.empty((pages, self.page_size, self._HKV, self._D), k.dtype) for _ in range(2))
            kp[order], vp[order] = (x.reshape(pages, self.page_size, self._HKV, self._D) for x in (k, v))
            host = [q, kp, vp, lens, order[None]]
        sets = _common.device_sets(host, _common.rotation_count(sum(a.nbytes for a in host)))
        self._call(*sets[0])
        _launch.synchronize()
        return sets

    @staticmethod
    def _call(q, k, v, lens, table=None):
        import cudattn

        return cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, causal=True)

    def track_tflops(self, page_size):
        """GPU time (calls back to back)."""
        ms = _common.gpu_ms_per_call(self._call, self.sets)
        return 4.0 * _causal_pairs(self._SQ, self._L) * self._HQ * self._D / ms / 1e9

    track_tflops.unit = "TFLOP/s"
