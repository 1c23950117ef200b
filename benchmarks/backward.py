"""Backward (Sq = Sk): `attention_backward` alone and a training step (forward with its LSE, then the
backward), on device arrays, on the GPU and as called.

FLOPs, FlashAttention's convention: the backward does five matrix products of the forward's size
against the forward's two, 2.5 times the forward's 4·B·H·S²·D (halved for causal); a training step
3.5 times.
"""

from . import _common

_FACTOR = {"backward": 2.5, "train_step": 3.5}


class Backward(_common.GpuTrack):
    version = "1"  # what it measures (see _common): bump only when that changes
    # (dtype, head dim, sequence length, causal): 16 Ki tokens a call, 16 heads, as Prefill.
    params = ([("bfloat16", 128, 8192, False), ("bfloat16", 128, 8192, True), ("bfloat16", 64, 4096, True),
               ("bfloat16", 256, 4096, True)],)
    param_names = ["dtype_D_S_causal"]

    def setup(self, case):
        _common.require_gpu()
        _common.require_api("attention_backward")
        dtype, head_dim, seqlen, causal = case
        self.shape = (16384 // seqlen, seqlen, 16, head_dim)
        self.causal = causal
        self.sets = _common.memo(("backward", *case), lambda: self._make_sets(dtype))

    def _make_sets(self, dtype: str):
        import cudattn
        from cudattn._runtime import launch as _launch

        host = [_common.randn(self.shape, dtype, seed) for seed in range(4)]  # q, k, v, dout
        # per set: q, k, v, dout, out and the gradients (the LSE is small)
        sets = _common.device_sets(host, _common.rotation_count(7 * host[0].nbytes))
        # (dout, q, k, v, out, lse): out and lse of cudattn's forward, made once a set
        sets = [(d, q, k, v, *cudattn.attention(q, k, v, causal=self.causal, return_lse=True)) for q, k, v, d in sets]
        self._backward(*sets[0])  # compile or load the kernels outside the timings
        self._train_step(*sets[0])
        _launch.synchronize()
        return sets

    def _backward(self, dout, q, k, v, out, lse):
        import cudattn

        return cudattn.attention_backward(dout, q, k, v, out, lse, causal=self.causal)

    def _train_step(self, dout, q, k, v, out, lse):
        """The forward (its LSE kept) and the backward of its output; the set's own out and lse unused."""
        import cudattn

        o, o_lse = cudattn.attention(q, k, v, causal=self.causal, return_lse=True)
        return cudattn.attention_backward(dout, q, k, v, o, o_lse, causal=self.causal)

    def _tflops(self, what: str, ms: float) -> float:
        B, S, H, D = self.shape
        return _FACTOR[what] * 4.0 * B * H * S * S * D / (2 if self.causal else 1) / ms / 1e9

    def track_backward_ms(self, case):
        """GPU time of the backward alone (calls back to back, the host's time hidden)."""
        return _common.gpu_ms_per_call(self._backward, self.sets, samples=5)

    track_backward_ms.unit = "ms"

    def track_backward_tflops(self, case):
        """The backward alone on the GPU, in TFLOP/s (2.5 forwards)."""
        return self._tflops("backward", _common.gpu_ms_per_call(self._backward, self.sets, samples=5))

    track_backward_tflops.unit = "TFLOP/s"

    def track_backward_tflops_as_called(self, case):
        """As called: one backward on an idle stream, the host's time of the call included."""
        return self._tflops("backward", _common.as_called_ms(self._backward, self.sets))

    track_backward_tflops_as_called.unit = "TFLOP/s"

    def track_train_step_ms(self, case):
        """GPU time of a training step: the forward with its LSE, then the backward."""
        return _common.gpu_ms_per_call(self._train_step, self.sets, samples=5)

    track_train_step_ms.unit = "ms"

    def track_train_step_tflops(self, case):
        """A training step on the GPU, in TFLOP/s (3.5 forwards)."""
        return self._tflops("train_step", _common.gpu_ms_per_call(self._train_step, self.sets, samples=5))

    track_train_step_tflops.unit = "TFLOP/s"

    def track_train_step_tflops_as_called(self, case):
        """As called: one training step (two calls) on an idle stream, the host's time included."""
        return self._tflops("train_step", _common.as_called_ms(self._train_step, self.sets))

    track_train_step_tflops_as_called.unit = "TFLOP/s"
