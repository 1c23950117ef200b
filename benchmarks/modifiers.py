"""Score modifiers, sliding windows and FP8 KV caches, on device arrays.

Modifiers: the plain prefill against softcap, attention sinks and ALiBi at 4 x 4096 x 16 heads x
128, bfloat16 (TFLOP/s of the full work: a modifier's cost shows as a lower figure). Window:
causal 4096 keys with a 512-key left window, TFLOP/s of the pairs the window keeps. FP8
modifiers: the same on e4m3 inputs with scalar descales. FP8 cache:
decode (one query token, 32 query heads on 8 kv heads, head dim 128) against an e4m3 cache,
in tokens per second.
"""

from . import _common

_B, _S, _H, _D = 4, 4096, 16, 128


def _require_keywords(fn_name: str, *names: str) -> None:
    """Skip (asv's NotImplementedError) at a commit whose cudattn function lacks these keywords."""
    import inspect

    import cudattn

    params = inspect.signature(getattr(cudattn, fn_name)).parameters
    missing = [n for n in names if n not in params]
    if missing:
        raise NotImplementedError(f"this cudattn.{fn_name} has no {', '.join(missing)}")


def _upload(host: list):
    """Device copies of q, k, v enough to exceed L2 (`_common.rotation_count`), uploaded."""
    from cudattn._runtime import launch as _launch

    sets = _common.device_sets(host, _common.rotation_count(3 * host[0].nbytes))
    _launch.synchronize()
    return sets


def _causal_pairs(s: int) -> int:
    return s * (s + 1) // 2


class Modifiers(_common.GpuTrack):
    version = "1"  # what it measures (see _common): bump only when that changes
    params = (["plain", "softcap", "sinks", "alibi", "window512"], [False, True])
    param_names = ["modifier", "causal"]
    _sets_key = ("modifiers",)

    def setup(self, modifier, causal):
        _common.require_gpu()
        _require_keywords("attention", "window_size", "softcap", "sinks", "alibi_slopes")
        if modifier == "window512" and not causal:
            raise NotImplementedError("the window row is causal")
        self.modifier, self.causal = modifier, causal
        self.sets = _common.memo(self._sets_key, self._make_sets)
        self.extra = _common.memo(("modifiers-extra",), self._make_extra)

    @staticmethod
    def _make_sets():
        return _upload([_common.randn((_B, _S, _H, _D), "bfloat16", s) for s in range(3)])

    @staticmethod
    def _make_extra():
        import numpy as np

        import cudattn

        rng = np.random.default_rng(0)
        return {"sinks": cudattn.to_device(rng.standard_normal(_H).astype(np.float32)),
                "alibi_slopes": cudattn.to_device((2.0 ** -np.linspace(1, 8, _H)).astype(np.float32))}

    def _modifier_kwargs(self) -> dict:
        return {"softcap": {"softcap": 30.0}, "sinks": {"sinks": self.extra["sinks"]},
                "alibi": {"alibi_slopes": self.extra["alibi_slopes"]}, "window512": {"window_size": (512, 0)},
                "plain": {}}[self.modifier]

    def _call(self, q, k, v):
        import cudattn

        return cudattn.attention(q, k, v, causal=self.causal, **self._modifier_kwargs())

    def _tflops(self, ms: float) -> float:
        if self.modifier == "window512":
            pairs = sum(min(i + 1, 513) for i in range(_S))
        else:
            pairs = _causal_pairs(_S) if self.causal else _S * _S
        return 4.0 * _B * _H * _D * pairs / ms / 1e9

    def track_tflops(self, modifier, causal):
        """GPU time (calls back to back)."""
        return self._tflops(_common.gpu_ms_per_call(self._call, self.sets))

    track_tflops.unit = "TFLOP/s"

    def track_tflops_as_called(self, modifier, causal):
        """One call on an idle stream, the host's time included."""
        return self._tflops(_common.as_called_ms(self._call, self.sets))

    track_tflops_as_called.unit = "TFLOP/s"


class Fp8Modifiers(Modifiers):
    """The same modifiers on FP8 inputs (e4m3 q, k, v, scalar descales); skipped at commits whose
    FP8 path refuses a modifier (NotImplementedError, asv's skip)."""

    version = "1"
    _sets_key = ("modifiers-fp8",)

    def setup(self, modifier, causal):
        super().setup(modifier, causal)
        self._call(*self.sets[0])  # an older commit raises NotImplementedError here

    @staticmethod
    def _make_sets():
        e4m3 = _common.np_dtype("float8_e4m3fn")
        return _upload([(_common.randn((_B, _S, _H, _D), "float16", s).astype("float32") * 8).clip(-448, 448)
                        .astype(e4m3) for s in range(3)])

    def _call(self, q, k, v):
        import cudattn

        return cudattn.attention(q, k, v, causal=self.causal, q_descale=0.125, k_descale=0.125, v_descale=0.125,
                                 **self._modifier_kwargs())


class Fp8Cache(_common.GpuTrack):
    version = "1"
    # (batch, cache length): one long context, a mid batch, many short sequences.
    params = (["float8_e4m3fn", "bfloat16"], [(1, 131072), (8, 8192), (64, 2048)])
    param_names = ["cache_dtype", "B_L"]

    def setup(self, cache_dtype, shape):
        _common.require_gpu()
        _require_keywords("attention_with_kvcache", "k_descale")
        self.fp8 = cache_dtype != "bfloat16"
        self.B = shape[0]
        self.sets = _common.memo(("fp8cache", cache_dtype, shape), lambda: self._make_sets(shape))

    def _make_sets(self, shape):
        import numpy as np

        from cudattn._runtime import launch as _launch

        B, L = shape
        q = _common.randn((B, 1, 32, 128), "bfloat16", 0)
        k, v = (_common.randn((B, L, 8, 128), "bfloat16", s) for s in (1, 2))
        if self.fp8:
            k, v = (np.clip(x.astype(np.float32) / 0.05, -448, 448).astype(_common.np_dtype("float8_e4m3fn"))
                    for x in (k, v))
        lens = np.full(B, L, np.int32)
        sets = _common.device_sets([q, k, v, lens], _common.rotation_count(k.nbytes + v.nbytes))
        self._call(*sets[0])
        _launch.synchronize()
        return sets

    def _call(self, q, k, v, lens):
        import cudattn

        kw = {"k_descale": 0.05, "v_descale": 0.05} if self.fp8 else {}
        return cudattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, **kw)

    def track_tokens_per_s(self, cache_dtype, shape):
        """Query tokens decoded per second, GPU time (calls back to back)."""
        return self.B / (_common.gpu_ms_per_call(self._call, self.sets) / 1e3)

    track_tokens_per_s.unit = "tokens/s"

    def track_tokens_per_s_as_called(self, cache_dtype, shape):
        """The same, one call on an idle stream, the host's time included."""
        return self.B / (_common.as_called_ms(self._call, self.sets) / 1e3)

    track_tokens_per_s_as_called.unit = "tokens/s"
