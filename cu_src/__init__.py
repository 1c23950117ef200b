"""CUDA C++ sources handed to NVRTC at run time (package data; read via importlib.resources)."""
