"""Kernel launches per kernel name, counted while a selfcheck run is in progress.

Every cudattn kernel goes through ``cudattn._runtime.launch.launch``, which its callers look up on the
module at each call (``_launch.launch(...)``); swapping that attribute for a counting wrapper
while the run lasts costs the ordinary hot path nothing. A case that counts no launch is
reported as a failure: either it ran no kernel, or a caller bound ``launch`` at import and
these counts no longer see it.
"""

from __future__ import annotations

import threading
from collections import Counter

from cudattn._runtime import launch as _launch


class LaunchCounter:
    """``with LaunchCounter() as lc:`` counts launches (successful ones) in every thread."""

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._original = None

    def __enter__(self) -> LaunchCounter:
        if self._original is not None:
            raise RuntimeError("LaunchCounter is not reentrant")
        original = self._original = _launch.launch
        counts, lock = self.counts, self._lock

        def counted_launch(kernel, *args, **kwargs):
            original(kernel, *args, **kwargs)
            with lock:
                counts[kernel.name] += 1

        _launch.launch = counted_launch
        return self

    def __exit__(self, *exc) -> None:
        _launch.launch, self._original = self._original, None

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def since(self, before: Counter[str]) -> dict[str, int]:
        """Launches per kernel name after ``before`` (a `snapshot`)."""
        now = self.snapshot()
        return {k: n - before.get(k, 0) for k, n in sorted(now.items()) if n - before.get(k, 0)}
