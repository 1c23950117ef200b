"""Prefill (Sq = Sk): forward attention throughput on device arrays, on the GPU and as called."""

from . import _common


class Prefill:
    version = "1"  # what it measures (see _common): bump only when that changes
    # (dtype, head dim, sequence length, causal): 16 Ki tokens per call (heads halved at D=256), so
    # every shape fills the GPU; short and long sequences, each head-dim tile, both masks.
    params = ([("bfloat16", 128, 1024, False), ("bfloat16", 128, 8192, False), ("bfloat16", 128, 8192, True),
               ("bfloat16", 64, 4096, False), ("bfloat16", 256, 4096, False), ("float16", 128, 8192, False)],)
    param_names = ["dtype_D_S_causal"]
    rounds = 1  # asv's default (2) runs every parameter set in two processes: twice the set-up time
    repeat = (3, 10, 2.0)
    number = 1
    warmup_time = 0.1
    timeout = 180

    def setup(self, case):
        _common.require_gpu()
        dtype, head_dim, seqlen, causal = case
        self.shape = (16384 // seqlen, seqlen, 16 if head_dim <= 128 else 8, head_dim)
        self.causal = causal
        self.sets = _common.memo(("prefill", case), lambda: self._make_sets(dtype))

    def _make_sets(self, dtype):
        from cudattn import _launch

        host = [_common.randn(self.shape, dtype, seed) for seed in range(3)]
        copies = _common.rotation_count(4 * host[0].nbytes)  # q, k, v and the output
        sets = _common.device_sets(host, copies)
        self._call(*sets[0])  # compile or load the kernel outside the timings
        _launch.synchronize()
        return sets

    def _call(self, q, k, v):
        import cudattn

        return cudattn.attention(q, k, v, causal=self.causal, layout="bshd")

    def _tflops(self, ms):
        B, S, H, D = self.shape
        return 4.0 * B * H * S * S * D / (2 if self.causal else 1) / ms / 1e9

    def track_tflops(self, case):
        """GPU time: calls queued back to back, the host's time hidden behind the GPU's."""
        return self._tflops(_common.gpu_ms_per_call(self._call, self.sets))

    track_tflops.unit = "TFLOP/s"

    def track_tflops_as_called(self, case):
        """As called: one call on an idle stream, the host's time of the call included."""
        return self._tflops(_common.as_called_ms(self._call, self.sets))

    track_tflops_as_called.unit = "TFLOP/s"
