"""Decode (one query token against a long KV sequence): bytes per second, on the GPU and as called.

Decode reads every K/V byte once for very little arithmetic, so the figure of merit is bytes per
second against HBM's (3.35 TB/s H100, 4.8 TB/s H200), not FLOP/s.
"""

from . import _common

_D = 128


class Decode(_common.GpuTrack):
    version = "1"  # what it measures (see _common): bump only when that changes
    # (batch, query heads, KV heads, KV length): GQA at two batch sizes, and one long context.
    params = ([(32, 32, 8, 4096), (8, 32, 8, 32768), (1, 32, 8, 131072)],)
    param_names = ["B_Hq_Hkv_Skv"]

    def setup(self, shape):
        _common.require_gpu()
        self.sets = _common.memo(("decode", shape), lambda: self._make_sets(shape))

    @staticmethod
    def _make_sets(shape):
        from cudattn._runtime import launch as _launch

        B, Hq, Hkv, S = shape
        host = [_common.randn((B, 1, Hq, _D), "float16", 0),
                _common.randn((B, S, Hkv, _D), "float16", 1),
                _common.randn((B, S, Hkv, _D), "float16", 2)]
        sets = _common.device_sets(host, _common.rotation_count(Decode._bytes(shape)))
        Decode._call(*sets[0])  # compile or load the kernel outside the timings
        _launch.synchronize()
        return sets

    @staticmethod
    def _bytes(shape):
        B, Hq, Hkv, S = shape
        return 2 * (2 * B * Hq * _D + 2 * B * S * Hkv * _D)  # q + out, k + v; float16

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
