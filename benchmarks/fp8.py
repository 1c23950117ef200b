"""FP8 (e4m3) prefill: forward attention throughput on the GPU, where the commit and the GPU have it."""

from . import _common
from .prefill import PrefillCase


class Fp8Prefill(PrefillCase):
    version = "1"  # what it measures (see _common): bump only when that changes
    # (head dim, sequence length, causal)
    params = ([(128, 8192, False), (256, 8192, False), (128, 8192, True)],)
    param_names = ["D_S_causal"]

    def setup(self, case):
        _common.require_gpu()
        _common.require_api("quantize_fp8")  # the FP8 API arrived with it
        if _common.device_attribute("COMPUTE_CAPABILITY_MAJOR", 0) * 10 + \
                _common.device_attribute("COMPUTE_CAPABILITY_MINOR", 0) < 89:
            raise NotImplementedError("FP8 needs sm_89 or newer")
        self.prepare("float8_e4m3fn", *case, out_bytes=2)  # a bfloat16 output

    def track_tflops(self, case):
        """GPU time per call (V's transpose included), calls queued back to back."""
        return self._tflops(_common.gpu_ms_per_call(self._call, self.sets))

    track_tflops.unit = "TFLOP/s"
