"""Host time of one warm attention() call on device arrays, from call to return.

The shape is tiny, so the GPU keeps up and launches never block: what is measured is validation,
planning, output allocation and the launch itself, which bound the speed of small decode steps.
"""

import statistics
import time

from . import _common

_CALLS = 2000
_SYNC_EVERY = 200  # keeps the queue short, so a full launch queue never blocks a call


class HostOverhead:
    params = (["new_output", "out="],)
    param_names = ["output"]
    timeout = 120

    def setup(self, output):
        _common.require_gpu()
        import cudattn
        from cudattn import _launch

        q = cudattn.to_device(_common.randn((1, 128, 1, 64), "float16", 0))
        if output == "out=":
            o = cudattn.attention(q, q, q)
            self.call = lambda: cudattn.attention(q, q, q, out=o)
        else:
            self.call = lambda: cudattn.attention(q, q, q)
        for _ in range(50):  # warm: kernel loaded, plan cached, memory pool grown
            self.call()
        _launch.synchronize()

    def track_host_overhead_us(self, output):
        from cudattn import _launch

        call, times = self.call, []
        for i in range(_CALLS):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
            if i % _SYNC_EVERY == _SYNC_EVERY - 1:
                _launch.synchronize()
        _launch.synchronize()
        return statistics.median(times) * 1e6

    track_host_overhead_us.unit = "us"
