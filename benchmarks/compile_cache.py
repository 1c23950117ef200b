"""NVRTC compile and the on-disk cubin cache (CPU only: these run, and are tracked, without a GPU).

What a user waits for before the first launch: a cold compile on a cache miss, else reading the
cubin from disk; and the key computation every cache lookup pays. One real variant (bf16, head
dim 128, no mask) for this GPU's arch, else sm_90a.
"""

import os
import shutil
import tempfile

from . import _common


def _target():
    arch = _common.compile_arch()
    return arch, _common.compile_variant_for(arch)


class CompileCold:
    rounds = 1
    repeat = 3  # a compile takes most of a second or more: a few samples, no warm-up calls
    number = 1
    warmup_time = 0
    timeout = 300

    def setup(self):
        from cudattn import _kernels

        self.arch, self.variant = _target()
        self.root = tempfile.mkdtemp(prefix="cudattn-asv-")
        # Load NVRTC and read the sources once per process (not per sample), so samples time
        # the compile alone.
        _common.memo("nvrtc-loaded", lambda: _kernels.compile_variant(self.variant, self.arch,
                                                                      cache=self._empty_cache()))

    def teardown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def _empty_cache(self):
        import nvrtc_cache

        return nvrtc_cache.Cache(tempfile.mkdtemp(dir=self.root))

    def time_compile_cold(self):
        """Cache miss: NVRTC compile to cubin, then the atomic write of the entry."""
        from cudattn import _kernels

        _kernels.compile_variant(self.variant, self.arch, cache=self._empty_cache())


class CacheHit:
    repeat = (20, 200, 2.0)
    timeout = 120

    def setup_cache(self):
        """One compile into a directory that outlives this process (asv's cwd for the benchmarks)."""
        import nvrtc_cache
        from cudattn import _kernels

        arch, variant = _target()
        directory = os.path.abspath("nvrtc-cache")
        _kernels.compile_variant(variant, arch, cache=nvrtc_cache.Cache(directory))
        return directory

    def setup(self, directory):
        import nvrtc_cache
        from cudattn import _kernels

        self.arch, self.variant = _target()
        self.cache = nvrtc_cache.Cache(directory)
        res = _kernels.compile_variant(self.variant, self.arch, cache=self.cache)
        if res.source == "compiled":  # the benchmarks would time something else than they say
            raise RuntimeError(f"cache in {directory} was not warm")

    def time_cache_hit_load(self, directory):
        """A fresh Cache over a warm directory: key, then read and verify the entry from disk."""
        import nvrtc_cache
        from cudattn import _kernels

        _kernels.compile_variant(self.variant, self.arch, cache=nvrtc_cache.Cache(directory))

    def time_cache_key(self, directory):
        """A Cache that already holds the entry in memory: essentially the key's sha256 over
        options, NVRTC version, source and headers, paid on each variant's first use per process."""
        from cudattn import _kernels

        _kernels.compile_variant(self.variant, self.arch, cache=self.cache)
