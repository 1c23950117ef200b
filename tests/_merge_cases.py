"""Shared pieces of the merge and KV-cache reference tests (test_merge_cpu.py,
test_reference_kvcache.py): -inf, and the fixture that turns every warning into an error.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

NINF = -np.inf


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    # No RuntimeWarning (0·NaN, 0/0, log 0, -inf - -inf) may leak out of a merge.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
