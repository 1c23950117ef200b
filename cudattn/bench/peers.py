"""The peers: torch SDPA with its cuDNN and flash backends, on the same inputs and stream.

Imported only when `cudattn bench` runs with torch importable; cudattn never imports torch.
Peers get their own contiguous ``(B, H, S, D)`` copies of each input set (torch SDPA's native
layout: handing them cudattn's (B, S, H, D) views could make a backend copy inside the timing).
GQA goes through ``enable_gqa=True``. Peers are skipped for causal cases with Sq != Sk, where
torch's top-left ``is_causal`` is not cudattn's bottom-right causal.

Backward rows (`bench.backward`): the backward alone is ``torch.autograd.grad(o, (q, k, v), dout,
retain_graph=True)`` of an output ``o`` made once by the same backend; a training step is the forward
and that grad together. The deterministic backward's peers run under torch's deterministic mode
(``torch.use_deterministic_algorithms(True)``), where torch makes the flash backend's backward
deterministic and refuses the cuDNN backend.
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

    def bare(self, case: Case):
        """``f(q, k, v)``: SDPA alone, for callers already inside ``scope(backend)`` (raises RuntimeError
        where the backend refuses the case). The timings enter the contexts once, so that entering
        them (microseconds of Python, which a torch user pays once, not per call) stays out of the
        calls' host time."""
        sdpa = self._sdpa
        kw = {"is_causal": case.causal}
        if case.Hq != case.Hkv:
            kw["enable_gqa"] = True
        return lambda q, k, v: sdpa(q, k, v, **kw)

    def grad_tensors(self, device_set) -> tuple:
        """Torch copies (as `tensors`) of one cudattn set ``(q, k, v, dout)``, q, k and v requiring grad."""
        q, k, v, dout = self.tensors(device_set)
        return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout

    def backward(self, case: Case, tsets: list, *, train: bool):
        """``f(i)``: the gradients of SDPA for set ``i % len(tsets)`` (sets from `grad_tensors`).
        ``train``: forward and backward together (a training step); else the backward alone, of
        outputs made here, once per set: call this inside ``scope(backend)``, so that they come from
        that backend (the backward follows the forward's backend)."""
        sdpa, grad, n = self.bare(case), self.torch.autograd.grad, len(tsets)
        if train:
            return lambda i: grad(sdpa(*tsets[i % n][:3]), tsets[i % n][:3], tsets[i % n][3])
        outs = [sdpa(*t[:3]) for t in tsets]
        return lambda i: grad(outs[i % n], tsets[i % n][:3], tsets[i % n][3], retain_graph=True)

    @contextlib.contextmanager
    def _deterministic(self, on: bool):
        """torch's deterministic mode (``on``), without its filling of new tensors (timed, it would add
        memory writes no kernel asks for); torch's settings restored after."""
        t = self.torch
        if not on:
            yield
            return
        try:
            import torch.utils.deterministic as fill
        except ImportError:  # an older torch: it fills nothing
            fill = None
        was, warn_only = t.are_deterministic_algorithms_enabled(), t.is_deterministic_algorithms_warn_only_enabled()
        filled = fill.fill_uninitialized_memory if fill else None
        t.use_deterministic_algorithms(True)
        if fill:
            fill.fill_uninitialized_memory = False
        try:
            yield
        finally:
            t.use_deterministic_algorithms(was, warn_only=warn_only)
            if fill:
                fill.fill_uninitialized_memory = filled

    @contextlib.contextmanager
    def scope(self, backend: str | None = None, *, deterministic: bool = False):
        """The peers' stream made torch's current stream, ``backend`` (None: all) made SDPA's only one,
        and with ``deterministic`` torch's deterministic mode on."""
        with self.torch.cuda.stream(self.stream), self._deterministic(deterministic):
            if backend is None:
                yield
            else:
                with self._ctx(self._backend[backend]):
                    yield
