"""Prefill (Sq = Sk): forward attention throughput on device arrays, on the GPU and as called."""

from . import _common


class PrefillCase(_common.GpuTrack):
    """What the prefill benchmarks share (no benchmarks of its own): one shape of 16 Ki tokens per
    call (heads halved at D=256, so every shape fills the GPU), its device input sets rotated past
    the L2 cache, the call and its TFLOP/s."""

    def prepare(self, dtype: str, head_dim: int, seqlen: int, causal: bool, out_bytes: int) -> None:
        """``out_bytes``: the output's bytes per element (the inputs' size is the dtype's)."""
        self.shape = (16384 // seqlen, seqlen, 16 if head_dim <= 128 else 8, head_dim)
        self.causal = causal
        self.sets = _common.memo((type(self).__name__, dtype, head_dim, seqlen, causal),
                                 lambda: self._make_sets(dtype, out_bytes))

    def _make_sets(self, dtype: str, out_bytes: int):
        from cudattn._runtime import launch as _launch

        host = [_common.randn(self.shape, dtype, seed) for seed in range(3)]
        per_set = 3 * host[0].nbytes + out_bytes * host[0].size  # q, k, v and the output
        sets = _common.device_sets(host, _common.rotation_count(per_set))
        self._call(*sets[0])  # compile or load the kernels outside the timings
        _launch.synchronize()
        return sets

    def _call(self, q, k, v):
        import cudattn

        return cudattn.attention(q, k, v, causal=self.causal, layout="bshd")

    def _tflops(self, ms: float) -> float:
        B, S, H, D = self.shape
        return 4.0 * B * H * S * S * D / (2 if self.causal else 1) / ms / 1e9


class Prefill(PrefillCase):
    version = "1"  # what it measures (see _common): bump only when that changes
    # (dtype, head dim, sequence length, causal): short and long sequences, each head-dim tile, both masks.
    params = ([("bfloat16", 128, 1024, False), ("bfloat16", 128, 8192, False), ("bfloat16", 128, 8192, True),
               ("bfloat16", 64, 4096, False), ("bfloat16", 256, 4096, False), ("float16", 128, 8192, False)],)
    param_names = ["dtype_D_S_causal"]

    def setup(self, case):
        _common.require_gpu()
        self.prepare(*case, out_bytes=2)

    def track_tflops(self, case):
        """GPU time: calls queued back to back, the host's time hidden behind the GPU's."""
        return self._tflops(_common.gpu_ms_per_call(self._call, self.sets))

    track_tflops.unit = "TFLOP/s"

    def track_tflops_as_called(self, case):
        """As called: one call on an idle stream, the host's time of the call included."""
        return self._tflops(_common.as_called_ms(self._call, self.sets))

    track_tflops_as_called.unit = "TFLOP/s"


class PrefillShortRows(Prefill):
    """Short sequences (256–1024 rows), where a tile's fixed costs and the last wave's balance
    weigh most: the query-tile rules by row count, causal (the longest rows' tiles at the bottom,
    the shortest at the top) and not. Prefill's tracks on other shapes."""

    version = "1"
    params = ([("bfloat16", 64, 256, True), ("bfloat16", 64, 384, True), ("bfloat16", 64, 512, True),
               ("bfloat16", 64, 1024, True), ("bfloat16", 64, 512, False), ("bfloat16", 128, 512, True)],)
