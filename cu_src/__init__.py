"""CUDA C++ sources handed to NVRTC at run time (package data; read via importlib.resources).

The repository keeps them at its top level; the wheel installs them as ``cudattn.cu_src``."""
