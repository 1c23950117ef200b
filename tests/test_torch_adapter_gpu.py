"""GPU: `cudattn.torch.attention` under autograd against torch SDPA's math backend in float64:
q, k, v (and the sinks) get gradients within FlashAttention's rule, the baseline being SDPA's
math backend run in the inputs' 16-bit dtype. Also: ``import cudattn`` never imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _sdpa(q, k, v, causal, dtype):
    """SDPA's math backend on (B, S, H, D) tensors converted to ``dtype``, GQA expanded."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (x.detach().to(dtype).transpose(1, 2).requires_grad_() for x in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                             enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2), (q, k, v)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_gradients_match_sdpa_math_float64(dtype, causal, heads):
    import cudattn.torch as ct

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(7)
    Hq, Hkv = heads
    q = torch.randn(2, 157, Hq, 64, device="cuda", generator=g).to(dt).requires_grad_()
    k = torch.randn(2, 157, Hkv, 64, device="cuda", generator=g).to(dt).requires_grad_()
    v = torch.randn(2, 157, Hkv, 64, device="cuda", generator=g).to(dt).requires_grad_()
    w = torch.randn(2, 157, Hq, 64, device="cuda", generator=g).to(dt)
    out = ct.attention(q, k, v, causal=causal)
    (out.float() * w.float()).sum().backward()
    grads = [x.grad.double() for x in (q, k, v)]
    ref_o, ref_in = _sdpa(q, k, v, causal, torch.float64)
    (ref_o * w.double()).sum().backward()
    low_o, low_in = _sdpa(q, k, v, causal, dt)
    (low_o.float() * w.float()).sum().backward()
    for name, got, r, n in zip("qkv", grads, ref_in, low_in):
        ref = r.grad.transpose(1, 2)
        naive = n.grad.transpose(1, 2).double()
        err = (got - ref).abs().max().item()
        bound = 2 * (naive - ref).abs().max().item() + 2 * ((ref + 0.3).to(dt).double() - 0.3 - ref).abs().max().item()
        assert err <= bound, f"d{name}: {err:.3g} > {bound:.3g}"
    assert torch.allclose(out.double(), ref_o, atol=2e-2)


def test_sinks_get_their_gradient():
    import cudattn.torch as ct
    from cudattn import reference
    import numpy as np

    q, k, v, w = (torch.randn(1, 64, 2, 32, device="cuda", dtype=torch.float16) for _ in range(4))
    sinks = torch.tensor([0.5, -1.0], device="cuda", requires_grad=True)
    out = ct.attention(q, k, v, sinks=sinks, causal=True)
    (out.float() * w.float()).sum().backward()
    ref = reference.attention_backward(w.cpu().numpy(), q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(),
                                       causal=True, sinks=sinks.detach().cpu().numpy())
    assert np.allclose(sinks.grad.cpu().numpy(), ref[3], rtol=1e-2, atol=1e-3)


def test_import_cudattn_does_not_import_torch():
    code = "import sys, cudattn; assert 'torch' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"
