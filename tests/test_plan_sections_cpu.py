"""CPU: the causal tile order's L2 sections (`_kernels.plan._l2_section`), the (batch, head) pairs
a section holds: all of them while their K/V fit in half of L2; sections of a few pairs where one
pair's K/V alone outgrows it (long sequences); otherwise pairs whose K/V fit, at least a quarter
of the CTAs' worth."""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest

from cudattn._kernels import plan

L2 = 60 << 20  # an H200's 60 MiB
CTAS = 132
BF16 = np.dtype(ml_dtypes.bfloat16)


def _problem(B, H, S, D=128, group=1):
    return types.SimpleNamespace(batch=B, heads_q=H, seqlen_k=S, head_dim=D, dtype=BF16, group_size=group)


@pytest.mark.parametrize("B,H,S,D,group,want", [
    (1, 16, 1024, 128, 1, 16),  # 16 pairs of 512 KiB of K/V fit: one section
    (1, 16, 16384, 128, 1, 16),  # 8 MiB a pair, 128 MiB in all: at least a quarter of the CTAs' worth
    (1, 16, 65536, 128, 1, plan.LONG_SECTION),  # 32 MiB a pair, over half of L2 alone
    (1, 16, 131072, 128, 1, plan.LONG_SECTION),
    (1, 1, 131072, 128, 1, 1),  # never more pairs than there are
    (1, 32, 65536, 128, 8, 32),  # GQA: 4 MiB of K/V a query head's share, all 32 pairs within a quarter of the CTAs
    (32, 16, 2048, 128, 1, 33),  # 1 MiB a pair, 512 pairs: 30 fit, a quarter of the CTAs (33) share
])
def test_sections(B, H, S, D, group, want):
    assert plan._l2_section(_problem(B, H, S, D, group), L2, CTAS) == want
