"""The peers: torch SDPA with its cuDNN and flash backends, on the same inputs and stream.

Imported only when `cudattn bench` runs with torch importable; cudattn never imports torch.
Peers get their own contiguous ``(B, H, S, D)`` copies of each input set (torch SDPA's native
layout: handing them cudattn's (B, S, H, D) views could make a backend copy inside the timing).
GQA goes through ``enable_gqa=True``. Peers are skipped for causal cases with Sq != Sk, where
torch's top-left ``is_causal`` is not cudattn's bottom-right causal.
"""

from __future__ import annotations

import contextlib

from .grids import FP8, Case

BACKENDS = ("cudnn", "flash")


def load_torch():
    """torch if it is importable with CUDA, else None."""
    try:
        import torch
    except Exception:
        return None
    return torch if torch.cuda.is_available() else None


class TorchPeers:
    def __init__(self, torch_mod):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch = torch_mod
        self._sdpa = F.scaled_dot_product_attention
        self._ctx = sdpa_kernel
        self._backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
        self.stream = torch_mod.cuda.Stream()
        self.stream_handle = int(self.stream.cuda_stream)

    def version(self) -> dict:
        t = self.torch
        return {"torch": t.__version__, "cudnn": t.backends.cudnn.version(), "cuda": t.version.cuda}

    def skip_reason(self, case: Case) -> str | None:
        if case.dtype == FP8:
            return "torch SDPA has no FP8 attention backend"
        if case.causal and case.Sq != case.Sk:
            return "torch is_causal is top-left aligned; cudattn's causal is bottom-right (Sq != Sk)"
        return None

    def tensors(self, device_set) -> tuple:
        """Contiguous (B, H, S, D) torch copies of one cudattn (B, S, H, D) set."""
        t = self.torch
        with t.cuda.stream(self.stream):
            return tuple(t.from_dlpack(a).transpose(1, 2).contiguous() for a in device_set)

    def call(self, backend: str, case: Case):
        """``f(q, k, v)`` running the backend on the peers' stream (raises RuntimeError if unsupported)."""
        bare, scope = self.bare(case), self.scope

        def f(q, k, v):
            with scope(backend):
                return bare(q, k, v)

        return f

    def bare(self, case: Case):
        """``f(q, k, v)``: SDPA alone, for callers already inside ``scope(backend)``. The as-called
        timings use it, so that entering the contexts (microseconds of Python, which a torch user
        pays once, not per call) stays out of the calls' host time."""
        sdpa = self._sdpa
        kw = {"is_causal": case.causal}
        if case.Hq != case.Hkv:
            kw["enable_gqa"] = True
        return lambda q, k, v: sdpa(q, k, v, **kw)

    @contextlib.contextmanager
    def scope(self, backend: str | None = None):
        """The peers' stream made torch's current stream, and ``backend`` (None: all) made SDPA's only one."""
        with self.torch.cuda.stream(self.stream):
            if backend is None:
                yield
            else:
                with self._ctx(self._backend[backend]):
                    yield
