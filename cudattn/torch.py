"""cudattn for PyTorch training: :func:`attention` as an autograd function.

Imported only by those who import it (``import cudattn`` never imports torch)::

    import cudattn.torch
    out = cudattn.torch.attention(q, k, v, causal=True)   # q, k, v: CUDA tensors, float16/bfloat16
    out.sum().backward()                                   # cudattn's backward fills q.grad, k.grad, v.grad

The forward runs :func:`cudattn.attention` (keeping its LSE) and the backward
:func:`cudattn.attention_backward`, both on torch's current stream, writing into tensors torch
allocates (so they come from torch's caching allocator and are ordinary tensors). ``sinks``, a
float32 tensor that requires grad, gets its gradient too. Arguments are those of
:func:`cudattn.attention`; ``causal`` is bottom-right aligned (it differs from SDPA's
``is_causal`` only when the query and key lengths differ).
"""

from __future__ import annotations

import torch

import cudattn

__all__ = ["attention"]


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, causal, scale, layout, window_size, softcap, alibi_slopes, deterministic):
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        _, lse = cudattn.attention(q, k, v, causal=causal, scale=scale, layout=layout, window_size=window_size,
                                   softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, return_lse=True, out=out,
                                   stream=_stream(q))
        lse = torch.from_dlpack(lse)
        ctx.save_for_backward(q, k, v, out, lse, sinks, alibi_slopes)
        ctx.flags = dict(causal=causal, scale=scale, layout=layout, window_size=window_size, softcap=softcap,
                         deterministic=deterministic)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, sinks, alibi_slopes = ctx.saved_tensors
        if dout.stride(-1) != 1 or dout.data_ptr() % 16 or any(s * dout.element_size() % 16 for s in dout.stride()[:-1]
                                                              if s):
            dout = dout.contiguous()  # autograd may hand over an expanded or odd view
        dq, dk, dv = (torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))
        res = cudattn.attention_backward(dout, q, k, v, out, lse, alibi_slopes=alibi_slopes, sinks=sinks, dq=dq,
                                         dk=dk, dv=dv, stream=_stream(q), **ctx.flags)
        dsinks = torch.from_dlpack(res[3]) if sinks is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, dsinks, None, None, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None,
              layout: str = "bshd", window_size: tuple[int, int] | None = None, softcap: float | None = None,
              alibi_slopes: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
              deterministic: bool = False) -> torch.Tensor:
    """:func:`cudattn.attention` on CUDA tensors, differentiable with respect to q, k, v (and sinks).

    ``deterministic=True`` makes the backward bit-identical run to run (see
    :func:`cudattn.attention_backward`). Returns the output, a new tensor of q's shape and dtype."""
    return _Attention.apply(q, k, v, sinks, causal, scale, layout, window_size, softcap, alibi_slopes, deterministic)
