"""Decode (one query token against a long KV sequence): bytes per second, on the GPU and as called.

Decode reads every K/V byte once for very little arithmetic, so the figure of merit is bytes per
second against HBM's (3.35 TB/s H100, 4.8 TB/s H200), not FLOP/s.
"""

from . import _common

_D = 128


class _DecodeInputs(_common.GpuTrack):
    """Rotated device copies of one decode call's q, k and v (no benchmark of its own):
    ``_shape(param)`` gives (batch, query heads, kv heads, KV length), ``dtype`` their type."""

    dtype = "float16"

    @staticmethod
    def _shape(param):
        return param

    def setup(self, param):
        _common.require_gpu()
        self.sets = _common.memo((type(self).__name__, param), lambda: self._make_sets(self._shape(param)))

    def _make_sets(self, shape):
        from cudattn._runtime import launch as _launch

        B, Hq, Hkv, S = shape
        host = [_common.randn((B, 1, Hq, _D), self.dtype, 0),
                _common.randn((B, S, Hkv, _D), self.dtype, 1),
                _common.randn((B, S, Hkv, _D), self.dtype, 2)]
        sets = _common.device_sets(host, _common.rotation_count(self._bytes(shape)))
        self._call(*sets[0])  # compile or load the kernel outside the timings
        _launch.synchronize()
        return sets

    def _bytes(self, shape):
        B, Hq, Hkv, S = shape
        return 2 * (2 * B * Hq * _D + 2 * B * S * Hkv * _D)  # q + out, k + v; 16-bit


class Decode(_DecodeInputs):
    version = "1"  # what it measures (see _common): bump only when that changes
    # (batch, query heads, KV heads, KV length): GQA at two batch sizes, and one long context.
    params = ([(32, 32, 8, 4096), (8, 32, 8, 32768), (1, 32, 8, 131072)],)
    param_names = ["B_Hq_Hkv_Skv"]

    @staticmethod
    def _call(q, k, v):
        import cudattn

        return cudattn.attention(q, k, v, causal=False, layout="bshd")

    def track_tbps(self, shape):
        """Bytes of q, k, v and out over GPU time per call (calls queued back to back)."""
        return self._bytes(shape) / _common.gpu_ms_per_call(self._call, self.sets) / 1e9

    track_tbps.unit = "TB/s"

    def track_tbps_as_called(self, shape):
        """The same bytes over one call's time on an idle stream, the host's time included."""
        return self._bytes(shape) / _common.as_called_ms(self._call, self.sets) / 1e9

    track_tbps_as_called.unit = "TB/s"


class TinyDecode(_DecodeInputs):
    """One token of one sequence whose query heads share one kv head (bf16, head dim 128): a few
    microseconds of kernel, where the split count, the splits' merge and the host's time per call
    decide the speed rather than bandwidth. Microseconds: GPU time with the host hidden behind a
    spin kernel, and as called (one call on an idle stream, the host's time included)."""

    version = "1"  # what it measures (see _common): bump only when that changes
    # (query heads, KV length): 8 heads at a short and a long cache, 32 heads (two 16-row blocks or
    # one of 32).
    params = ([(8, 8192), (8, 131072), (32, 8192), (32, 131072)],)
    param_names = ["Hq_Skv"]

    dtype = "bfloat16"

    @staticmethod
    def _shape(param):
        Hq, S = param
        return 1, Hq, 1, S

    @staticmethod
    def _call(q, k, v, stream=None):
        import cudattn

        return cudattn.attention(q, k, v, stream=stream)

    def track_gpu_us(self, shape):
        """GPU time of one call, the host hidden behind a spin kernel."""
        return 1e3 * _common.gpu_ms_behind_spin(self._call, self.sets)

    track_gpu_us.unit = "us"

    def track_as_called_us(self, shape):
        """One call's time on an idle stream, the host's time included."""
        return 1e3 * _common.as_called_ms(self._call, self.sets)

    track_as_called_us.unit = "us"
