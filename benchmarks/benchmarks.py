"""asv suite: forward attention throughput on the GPU (skipped where there is none).

Times the kernel on device arrays with CUDA events (median of repeats after warm-up), and
reports TFLOP/s as a tracked value so the dashboard shows speed commit by commit.
"""

import numpy as np


def _gpu():
    try:
        from cuda.bindings import driver

        return driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS and driver.cuDeviceGetCount()[1] > 0
    except Exception:
        return False


class Forward:
    params = (["float16", "bfloat16"], [(4, 16, 4096, 64), (4, 16, 4096, 128), (4, 8, 2048, 256)], [False, True])
    param_names = ["dtype", "shape", "causal"]
    timeout = 300

    def setup(self, dtype, shape, causal):
        if not _gpu():
            raise NotImplementedError("no CUDA GPU")  # asv's way to skip
        import ml_dtypes

        import cudattn
        from cudattn import _launch

        dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
        B, H, S, D = shape
        rng = np.random.default_rng(0)
        self.args = [cudattn.to_device(rng.standard_normal((B, S, H, D), dtype=np.float32).astype(dt)) for _ in range(3)]
        self.causal = causal
        self.flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
        self._launch = _launch
        self._run = lambda: cudattn.attention(*self.args, causal=causal)
        _launch.time_ms(self._run)  # warm-up: compile or load, and wait for it

    def track_tflops(self, dtype, shape, causal):
        times = []
        for _ in range(20):
            t = self._launch.time_ms(self._run)
            times.append(t)
        return self.flops / float(np.median(times)) / 1e9

    track_tflops.unit = "TFLOP/s"
