"""The float64 NumPy reference (CPU): every GPU test pays it, so a slowdown here slows the tests."""

from . import _common


class Reference:
    version = "1"  # what it measures (see _common): bump only when that changes
    params = ([False, True],)
    param_names = ["causal"]

    def setup(self, causal):
        from cudattn import reference  # here, so the first timed call does not pay the import

        self.attention = reference.attention
        self.qkv = tuple(_common.randn((1, 256, 4, 64), "float16", seed) for seed in range(3))

    def time_reference(self, causal):
        self.attention(*self.qkv, causal=causal)
