"""The package list, which pyproject.toml cannot say alone: the repository keeps the CUDA sources at
its top level (``cu_src/``), and the wheel installs them as ``cudattn.cu_src``, inside cudattn's
namespace, so that cudattn claims no generic top-level name. Every package under ``cudattn`` and
``nvrtc_cache`` is found, so a new subpackage cannot be left out of the wheel (tests/test_packaging.py
builds the wheel and checks). ``nvrtc_cache`` (the NVRTC compile cache) stays a package of its own:
it knows nothing of attention and is used by cudattn through its public API only.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["cudattn", "cudattn.*", "nvrtc_cache", "nvrtc_cache.*"]), "cudattn.cu_src"],
    package_dir={"cudattn.cu_src": "cu_src"},
)
