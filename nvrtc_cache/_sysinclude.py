"""The CUDA headers (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h…) shipped in the pip wheel."""

from __future__ import annotations

import functools
import hashlib
import os


@functools.cache
def include_dir() -> str | None:
    import cuda.pathfinder  # deferred: keeps ``import nvrtc_cache`` cheap

    return cuda.pathfinder.find_nvidia_header_directory("cudart")


@functools.cache
def fingerprint(directory: str | None) -> str:
    """sha256 over every file's relative path and contents under ``directory``.

    Why contents, and all of them: the headers a kernel pulls in include one
    another (cuda_fp8.hpp → cuda_fp16.h, vector_types.h…), so picking "the few
    relevant" files would silently miss one. The whole tree is ~100 files / 5 MB
    and hashes in ~10 ms, once per process (memoised). Hashing contents rather
    than mtimes keeps the key stable across reinstalls and across virtualenvs
    holding the same wheel, while any real header change still changes the key.
    The memo means a wheel upgraded under a running process is not noticed until
    the next process, which is also when the new headers would be loaded anyway.
    """
    if directory is None:
        return "none"
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for file_name in sorted(files):
            path = os.path.join(root, file_name)
            rel = os.path.relpath(path, directory).encode()
            with open(path, "rb") as f:
                data = f.read()
            for part in (rel, data):
                digest.update(len(part).to_bytes(8, "little"))
                digest.update(part)
    return digest.hexdigest()
