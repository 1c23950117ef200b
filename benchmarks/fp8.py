"""FP8 (e4m3) prefill: forward attention throughput on the GPU, where the commit and the GPU have it."""

from . import _common


class Fp8Prefill:
    version = "1"  # what it measures (see _common): bump only when that changes
    # (head dim, sequence length, causal): 16 Ki tokens per call, heads halved at D=256.
    params = ([(128, 8192, False), (256, 8192, False), (128, 8192, True)],)
    param_names = ["D_S_causal"]
    rounds = 1
    repeat = (3, 10, 2.0)
    number = 1
    warmup_time = 0.1
    timeout = 180

    def setup(self, case):
        _common.require_gpu()
        _common.require_api("quantize_fp8")  # the FP8 API arrived with it
        if _common.device_attribute("COMPUTE_CAPABILITY_MAJOR", 0) * 10 + \
                _common.device_attribute("COMPUTE_CAPABILITY_MINOR", 0) < 89:
            raise NotImplementedError("FP8 needs sm_89 or newer")
        head_dim, seqlen, causal = case
        self.shape = (16384 // seqlen, seqlen, 16 if head_dim <= 128 else 8, head_dim)
        self.causal = causal
        self.sets = _common.memo(("fp8", case), self._make_sets)

    def _make_sets(self):
        from cudattn import _launch

        host = [_common.randn(self.shape, "float8_e4m3fn", seed) for seed in range(3)]
        # q, k, v one byte an element, the bfloat16 output two
        sets = _common.device_sets(host, _common.rotation_count(5 * host[0].nbytes))
        self._call(*sets[0])  # compile or load the kernels outside the timings
        _launch.synchronize()
        return sets

    def _call(self, q, k, v):
        import cudattn

        return cudattn.attention(q, k, v, causal=self.causal, layout="bshd")

    def track_tflops(self, case):
        """GPU time per call (V's transpose included), calls queued back to back."""
        B, S, H, D = self.shape
        flops = 4.0 * B * H * S * S * D / (2 if self.causal else 1)
        return flops / _common.gpu_ms_per_call(self._call, self.sets) / 1e9

    track_tflops.unit = "TFLOP/s"
