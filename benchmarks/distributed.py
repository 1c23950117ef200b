"""Ring attention on two GPUs (`cudattn.distributed`): 32 Ki tokens a GPU, bfloat16, 16 heads, head
dim 128, causal (zigzag). Per-GPU TFLOP/s of the slowest rank, and the communication left exposed
per ring step (the ring's time less the same steps without NCCL). Skipped below two GPUs, without
nccl4py, and at commits without `cudattn.distributed`.
"""

from . import _common


class Ring:
    version = "1"  # what it measures (see _common): bump only when that changes
    rounds = 1
    repeat = 1
    number = 1
    timeout = 600

    def setup(self):
        _common.require_gpu()
        from cuda.bindings import driver

        if driver.cuDeviceGetCount()[1] < 2:
            raise NotImplementedError("fewer than 2 GPUs")
        try:
            import nccl.core  # noqa: F401
            from cudattn.distributed import scaling
        except ImportError as e:
            raise NotImplementedError(f"no ring here: {e}") from None
        case = {"B": 1, "H": 16, "Hkv": 16, "S": 2 * 32768, "D": 128, "dtype": "bfloat16", "causal": True, "seed": 1}
        self.row = _common.memo(("ring", 2), lambda: scaling.measure(case, 2, 10))

    def track_tflops_per_gpu(self):
        """Per-GPU TFLOP/s of the ring on 2 GPUs (the slowest rank's median GPU time)."""
        return self.row["tflops_per_gpu"]

    track_tflops_per_gpu.unit = "TFLOP/s"

    def track_exposed_comm_ms_per_step(self):
        """Milliseconds of communication left exposed per ring step."""
        return self.row["exposed_ms_per_step"]

    track_exposed_comm_ms_per_step.unit = "ms"
