"""NVRTC compile and the on-disk cubin cache (CPU only: these run, and are tracked, without a GPU).

What a user waits for before the first launch: a cold compile on a cache miss, else reading the
cubin from disk; and the key computation every cache lookup pays. One real variant (bf16, head
dim 128, no mask: the Hopper kernel where the commit has it) for this GPU's arch, else sm_90a.
"""

import os
import tempfile

from . import _common


def _target():
    arch = _common.compile_arch()
    return arch, _common.compile_variant_for(arch)


class CompileCold:
    """The first compile of a kernel in a process, as a user meets it on a cache miss.

    Each sample is a fresh interpreter: a compile timed after another in the same process is not
    what a user waits for (NVRTC's library is loaded, and the process may keep state that makes a
    second compile of the same source cheaper), so the child times its one compile (NVRTC and
    ptxas, then the atomic write of the entry into an empty cache) and prints the seconds."""

    version = "1"  # what it measures (see _common): bump only when that changes
    rounds = 1
    repeat = 1
    number = 1
    timeout = 300

    def setup(self):
        self.arch, self.variant = _target()

    def track_compile_cold_s(self):
        import json
        import subprocess
        import sys

        with tempfile.TemporaryDirectory(prefix="cudattn-asv-") as root:
            # the benchmark process's path as it is: the commit's cudattn first (not the checkout
            # that holds the suite)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            times = []
            for _ in range(3):
                child = subprocess.run([sys.executable, "-c", _CHILD, self.arch, json.dumps(_variant_key(self.variant)),
                                        tempfile.mkdtemp(dir=root)], env=env, capture_output=True, text=True, cwd=root)
                if child.returncode:
                    raise RuntimeError(f"the compile process failed:\n{child.stderr[-3000:]}")
                times.append(float(child.stdout.split()[-1]))
        return sorted(times)[1]  # the median of three fresh processes

    track_compile_cold_s.unit = "seconds"


def _variant_key(v):
    return [v.dtype, v.tile_dim, v.causal]


# One compile in a fresh process: the benchmark's variant (chosen as `_common.compile_variant_for`
# does; the suite itself is not importable there), an empty cache, the seconds printed last.
_CHILD = """
import json, sys, time
import nvrtc_cache
from cudattn._kernels import registry as _kernels, traits as _traits
arch, (dtype, tile_dim, causal), root = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
found = [v for v in _traits.all_variants(arch) if (v.dtype, v.tile_dim, v.causal) == (dtype, tile_dim, causal)]
variant = next((v for v in found if getattr(v, "family", "sm80") == "sm90"), found[0])
t0 = time.perf_counter()
res = _kernels.compile_variant(variant, arch, cache=nvrtc_cache.Cache(root))
seconds = time.perf_counter() - t0
assert res.source == "compiled", res.source
print(seconds)
"""


class CacheHit:
    version = "1"  # what it measures (see _common): bump only when that changes
    repeat = (20, 200, 2.0)
    timeout = 120

    def setup_cache(self):
        """One compile into a directory that outlives this process (asv's cwd for the benchmarks)."""
        import nvrtc_cache
        from cudattn._kernels import registry as _kernels

        arch, variant = _target()
        directory = os.path.abspath("nvrtc-cache")
        _kernels.compile_variant(variant, arch, cache=nvrtc_cache.Cache(directory))
        return directory

    def setup(self, directory):
        import nvrtc_cache
        from cudattn._kernels import registry as _kernels

        self.arch, self.variant = _target()
        self.cache = nvrtc_cache.Cache(directory)
        res = _kernels.compile_variant(self.variant, self.arch, cache=self.cache)
        if res.source == "compiled":  # the benchmarks would time something else than they say
            raise RuntimeError(f"cache in {directory} was not warm")

    def time_cache_hit_load(self, directory):
        """A fresh Cache over a warm directory: key, then read and verify the entry from disk."""
        import nvrtc_cache
        from cudattn._kernels import registry as _kernels

        _kernels.compile_variant(self.variant, self.arch, cache=nvrtc_cache.Cache(directory))

    def time_cache_key(self, directory):
        """A Cache that already holds the entry in memory: essentially the key's sha256 over
        options, NVRTC version, source and headers, paid on each variant's first use per process."""
        from cudattn._kernels import registry as _kernels

        _kernels.compile_variant(self.variant, self.arch, cache=self.cache)
