"""Host time of one warm attention() call on device arrays, from call to return.

The shape is tiny, so the GPU keeps up and launches never block: what is measured is validation,
planning, output allocation and the launch itself, which bound the speed of small decode steps.
Operands: cudattn DeviceArrays, and torch tensors where torch imports with CUDA (what torch users
pay: the DLPack import of each tensor on top), passed with no stream= (the operands' default).
"""

import statistics
import time

from . import _common

_CALLS = 2000
_SYNC_EVERY = 200  # keeps the queue short, so a full launch queue never blocks a call
_SHAPE = (1, 128, 1, 64)  # (B, S, H, D)


def _torch():
    """torch with CUDA, or NotImplementedError (asv's "skipped")."""
    try:
        import torch
    except ImportError:
        raise NotImplementedError("torch not installed") from None
    if not torch.cuda.is_available():
        raise NotImplementedError("torch has no CUDA device")
    return torch


class HostOverhead:
    params = (["DeviceArray", "torch"], ["new_output", "out="])
    param_names = ["operands", "output"]
    timeout = 120

    def setup(self, operands, output):
        _common.require_gpu()
        import cudattn
        from cudattn import _launch

        host = _common.randn(_SHAPE, "float16", 0)
        if operands == "torch":
            torch = _torch()
            q = torch.from_numpy(host).cuda()
            # torch's stream and cudattn's: wherever stream=None puts the work, the sync covers it
            self.sync = lambda: (torch.cuda.synchronize(), _launch.synchronize())
        else:
            q = cudattn.to_device(host)
            self.sync = _launch.synchronize
        if output == "out=":
            o = q.clone() if operands == "torch" else cudattn.attention(q, q, q)
            self.call = lambda: cudattn.attention(q, q, q, out=o)
        else:
            self.call = lambda: cudattn.attention(q, q, q)
        for _ in range(50):  # warm: kernel loaded, plan cached, memory pool grown
            self.call()
        self.sync()

    def track_host_overhead_us(self, operands, output):
        call, sync, times = self.call, self.sync, []
        for i in range(_CALLS):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
            if i % _SYNC_EVERY == _SYNC_EVERY - 1:
                sync()
        sync()
        return statistics.median(times) * 1e6

    track_host_overhead_us.unit = "us"
