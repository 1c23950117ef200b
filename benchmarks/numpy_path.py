"""NumPy in, NumPy out: the whole synchronous call, copies to and from the GPU included.

This path is bound by host<->device transfers (PCIe moves bytes far slower than the kernel eats
them), so the tracked figure is bytes moved per second of wall time.
"""

from . import _common


class _WholeCall:
    """What both classes time: one large bf16 prefill, (B, S, H, D) and dtype, a few whole calls."""

    params = ([((4, 4096, 16, 128), "bfloat16")],)
    param_names = ["shape_dtype"]
    rounds = 1
    repeat = (3, 10, 3.0)
    number = 1
    warmup_time = 0
    timeout = 180


class NumpyEndToEnd(_WholeCall):
    version = "1"  # what it measures (see _common): bump only when that changes

    def setup(self, shape_dtype):
        _common.require_gpu()
        self.qkv = _common.memo(("numpy", shape_dtype), lambda: self._make(*shape_dtype))

    @staticmethod
    def _make(shape, dtype):
        import cudattn

        qkv = tuple(_common.randn(shape, dtype, seed) for seed in range(3))
        cudattn.attention(*qkv)  # compile or load the kernel, allocate staging buffers
        return qkv

    def track_numpy_gbps(self, shape_dtype):
        """Input plus output bytes over the median wall time of a few calls."""
        import cudattn

        seconds = _common.wall_seconds(lambda: cudattn.attention(*self.qkv), repeats=5)
        return 4 * self.qkv[0].nbytes / seconds / 1e9

    track_numpy_gbps.unit = "GB/s"


class NumpyEndToEndPinned(_WholeCall):
    """The same call with q, k, v and ``out`` from ``cudattn.empty_pinned`` (DMA from and into the
    caller's arrays, no staging copy); n/a at commits without it."""

    version = "1"

    def setup(self, shape_dtype):
        _common.require_gpu()
        _common.require_api("empty_pinned")
        self.arrays = _common.memo(("numpy-pinned", shape_dtype), lambda: self._make(*shape_dtype))

    @staticmethod
    def _make(shape, dtype):
        import cudattn

        pinned = []
        for seed in range(4):  # q, k, v, out
            src = _common.randn(shape, dtype, seed)
            a = cudattn.empty_pinned(shape, src.dtype)
            a[...] = src
            pinned.append(a)
        q, k, v, out = pinned
        cudattn.attention(q, k, v, out=out)  # compile or load the kernel
        return q, k, v, out

    def track_numpy_pinned_gbps(self, shape_dtype):
        """Input plus output bytes over the median wall time of a few calls."""
        import cudattn

        q, k, v, out = self.arrays
        seconds = _common.wall_seconds(lambda: cudattn.attention(q, k, v, out=out), repeats=5)
        return 4 * q.nbytes / seconds / 1e9

    track_numpy_pinned_gbps.unit = "GB/s"
