"""The package list, which pyproject.toml cannot say alone: the repository keeps the CUDA sources at
its top level (``cu_src/``), and the wheel installs them as ``cudattn.cu_src``, inside cudattn's
namespace, so that cudattn claims no generic top-level name. Every package under ``cudattn`` and
``nvrtc_cache`` is found, so a new subpackage cannot be left out of the wheel (tests/test_packaging.py
builds the wheel and checks). ``nvrtc_cache`` (the NVRTC compile cache) stays a package of its own:
it knows nothing of attention and is used by cudattn through its public API only.

One C extension, ``cudattn._calls._warm`` (the warm call path; see cudattn/_calls/warm.py), is
built against the stable ABI (one build for Python 3.10 and newer) from the files of
cudattn/_calls/_warm_c/, its symbols hidden but for the module's init, and is optional: where no C
compiler is found, the build goes on without it and every call takes the Python path. It links
nothing of CUDA (the driver's entry points are looked up at run time).
"""

import glob

from setuptools import Extension, find_packages, setup

_WARM = "cudattn/_calls/_warm_c"  # the extension's sources, one file a role (warm.h says which)

setup(
    packages=[*find_packages(include=["cudattn", "cudattn.*", "nvrtc_cache", "nvrtc_cache.*"]), "cudattn.cu_src"],
    package_dir={"cudattn.cu_src": "cu_src"},
    ext_modules=[Extension("cudattn._calls._warm", sorted(glob.glob(f"{_WARM}/*.c")), py_limited_api=True,
                           optional=True, depends=[f"{_WARM}/warm.h"], define_macros=[("Py_LIMITED_API", "0x030A0000")],
                           extra_compile_args=["-O2", "-fvisibility=hidden"])],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
