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
    (32, 16, 2048, 128, 1, 32),  # 1 MiB a pair, 512 pairs: 30 fit, a quarter of the CTAs (33) share, 16 sections of 32
])
def test_sections(B, H, S, D, group, want):
    assert plan._l2_section(_problem(B, H, S, D, group), L2, CTAS) == want


@pytest.mark.parametrize("B,H,S,D,want", [
    (16, 16, 512, 64, 128),  # 256 pairs of 128 KiB: 229 fit; two sections of 128, not 229 and 27
    (8, 16, 2048, 64, 43),  # 128 pairs of 512 KiB: 60 fit; 43, 43 and 42, not 60, 60 and 8
    (8, 16, 1024, 128, 43),
    (4, 16, 4096, 64, 32),  # 64 pairs of 1 MiB: a quarter of the CTAs (33); 32 and 32
])
def test_sections_come_out_even(B, H, S, D, want):
    """Each section's tiles come longest first: a short last section would put long tiles at the end
    of the call, where a few CTAs run them while the rest have nothing left."""
    assert plan._l2_section(_problem(B, H, S, D), L2, CTAS) == want


@pytest.mark.parametrize("B", [1, 2, 3, 5, 7, 8, 13, 16, 31, 32, 64])
@pytest.mark.parametrize("S,D", [(512, 64), (1000, 128), (2048, 64), (8192, 128), (65536, 128), (131072, 256)])
def test_no_section_holds_more_than_the_rule_nor_leaves_a_short_rest(B, S, D):
    """Sections never exceed the rule's size (L2 holds each), and the last one falls short of the
    others by fewer pairs than there are sections."""
    p = _problem(B, 16, S, D)
    pairs = B * 16
    got = plan._l2_section(p, L2, CTAS)
    kv = 2 * S * D * 2
    if pairs * kv <= L2 // 2:
        assert got == pairs
        return
    rule = min(pairs, plan.LONG_SECTION) if kv > L2 // 2 else max(1, min(pairs, max(L2 // 2 // kv, CTAS // 4)))
    sections = -(-pairs // got)
    assert got <= rule and sections == -(-pairs // rule)
    assert got - (pairs - (sections - 1) * got) < sections


@pytest.mark.parametrize("S,bm,want", [
    (512, 192, 1),  # 128 rows in the last block: its third consumer past the end, a short tile
    (1000, 192, 1),  # 40 rows: two consumers past the end
    (1024, 192, 1),
    (576, 192, 0),  # whole blocks
    (4000, 192, 0),  # 160 rows: every consumer has rows
    (960, 128, 1),  # 64 rows: the second consumer past the end
    (1000, 128, 0),  # 104 rows: both consumers have rows
    (1000, 64, 0),  # one consumer: no tile is shorter than another
])
def test_full_order_puts_short_last_blocks_last(S, bm, want):
    """Without causal masking the tile order is head-major, except that a padded batch whose last query
    block leaves whole 64-row consumers past the sequence's end has those shorter tiles come last."""
    p = types.SimpleNamespace(**vars(_problem(4, 16, S)), seqlen_q=S, causal=False, varlen=None)
    assert plan._tile_order(p, bm, L2, CTAS) == want
    packed = types.SimpleNamespace(**vars(p) | {"varlen": object()})
    assert plan._tile_order(packed, bm, L2, CTAS) == 0  # packed sequences: each its own last block
