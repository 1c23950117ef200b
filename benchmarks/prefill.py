"""Prefill (Sq = Sk): forward attention throughput on device arrays, per dtype, head dim, length, mask."""

from . import _common


class Prefill:
    params = (["float16", "bfloat16"], [64, 128, 256], [1024, 4096], [False, True])
    param_names = ["dtype", "head_dim", "seqlen", "causal"]
    rounds = 1  # asv's default (2) runs every parameter set in two processes: twice the set-up time
    repeat = (5, 20, 2.0)
    number = 1
    warmup_time = 0.1
    timeout = 180

    def setup(self, dtype, head_dim, seqlen, causal):
        _common.require_gpu()
        # 16 Ki tokens per call, heads halved at D=256: every shape fills the GPU, none takes long.
        self.shape = (16384 // seqlen, seqlen, 16 if head_dim <= 128 else 8, head_dim)
        self.causal = causal
        self.sets = _common.memo(("prefill", dtype, head_dim, seqlen, causal), lambda: self._make_sets(dtype))
        self.i = 0

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

    def track_tflops(self, dtype, head_dim, seqlen, causal):
        B, S, H, D = self.shape
        flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
        return flops / _common.gpu_ms_per_call(self._call, self.sets) / 1e9

    track_tflops.unit = "TFLOP/s"

    def time_forward(self, dtype, head_dim, seqlen, causal):
        """Wall time of one call until its result is ready: kernel plus host overhead."""
        from cudattn import _launch

        self._call(*self.sets[self.i % len(self.sets)])
        _launch.synchronize()
        self.i += 1
