"""Which attention calls a rank makes at each ring step: pure arithmetic, no GPU.

The sequence is cut into chunks of equal length ``c``. A rank holds some chunks of the queries
and, at each ring step, the K/V chunks of one other rank. For every (query chunk, key chunk)
pair the global mask (causal, a window) becomes a local call on a sub-range of rows and keys:

With bottom-right alignment a call on rows ``[qa, qb)`` and keys ``[ka, kb)`` of the two chunks
sees key ``j`` from row ``i`` iff ``j - i`` lies in ``[kb - qb - L, kb - qb + R]`` (its window
``(L, R)``, local indices). Globally the band is ``[d - left, d + right]`` with ``d`` the query
chunk's offset minus the key chunk's. Only the ends ``qb``, ``kb`` move the local band, so the
call keeps the rows and keys that see anything and picks ``L = left - d + kb - qb`` and
``R = right + d - kb + qb``, both >= 0 by construction. A pair that sees nothing is skipped
(a window's empty ring steps cost nothing).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class Block:
    """One local attention call: query rows ``[qa, qb)`` of query chunk ``q_chunk`` against keys
    ``[ka, kb)`` of key chunk ``k_chunk`` (chunk indices in the whole sequence), with ``causal``
    and ``window`` as `cudattn.attention` takes them, and ``sinks`` on exactly one call per chunk."""

    q_chunk: int
    k_chunk: int
    qa: int
    qb: int
    ka: int
    kb: int
    causal: bool
    window: tuple[int, int] | None
    sinks: bool = False

    def alibi_shift(self, c: int) -> int:
        """How far ALiBi's diagonal must move right of the local call's own (bottom-right) one so
        that its distances are the whole sequence's (`_kernels.alibi_shift`): query row ``qa + i``
        of chunk ``q_chunk`` and key ``ka + j`` of chunk ``k_chunk`` lie ``(q_chunk - k_chunk) * c
        + qa + i - ka - j`` apart, and the call's diagonal is ``i + (kb - ka) - (qb - qa)``."""
        return (self.q_chunk - self.k_chunk) * c - (self.kb - self.qb)

    def full(self, c: int) -> bool:
        """Every row of the query chunk sees every key of the key chunk (chunks of length ``c``)."""
        return not self.causal and self.window is None and (self.qa, self.qb, self.ka, self.kb) == (0, c, 0, c)


def chunks_of(rank: int, world: int, zigzag: bool) -> tuple[int, ...]:
    """The chunks rank ``rank`` holds, in its local order: zigzag cuts the sequence into ``2·world``
    chunks and gives rank r chunks r and 2·world-1-r (an early and a late one, so that causal work is
    even); otherwise rank r holds chunk r of ``world``."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must lie in [0, world={world}); got {rank}")
    return (rank, 2 * world - 1 - rank) if zigzag else (rank,)


def pair_block(q_chunk: int, k_chunk: int, c: int, left: float, right: float) -> Block | None:
    """The call for one (query chunk, key chunk) pair of length ``c`` each under the global band
    ``j - i in [-left, right]`` (``INF``: unbounded), or None when the pair sees nothing."""
    d = (q_chunk - k_chunk) * c  # global row offset minus key offset: key j is seen iff j - i in band + d
    # rows i that see some key j in [0, c): i + d - left <= c - 1 and i + d + right >= 0
    qa = 0 if right == INF else max(0, -d - int(right))
    qb = c if left == INF else min(c, c - d + int(left))
    if qa >= qb:
        return None
    kb = c if right == INF else min(c, qb + d + int(right))
    ka = 0 if left == INF else max(0, qa + d - int(left))
    if ka >= kb:
        return None
    # a bound no (row, key) of the block reaches is dropped: its side is unbounded there
    if right != INF and (kb - 1) - qa <= d + right:
        right = INF
    if left != INF and ka - (qb - 1) >= d - left:
        left = INF
    lo = kb - qb  # the local diagonal's offset
    L = INF if left == INF else left - d + lo
    R = INF if right == INF else right + d - lo
    if L == INF and R == INF:
        causal, window = False, None
    elif L == INF and R == 0:
        causal, window = True, None
    else:
        causal, window = False, (-1 if L == INF else int(L), -1 if R == INF else int(R))
    return Block(q_chunk, k_chunk, qa, qb, ka, kb, causal, window)


def band(causal: bool, window_size: tuple[int, int] | None) -> tuple[float, float]:
    """The global band ``(left, right)`` of ``causal`` and ``window_size`` (as `cudattn.attention`
    takes them; ``-1`` unbounded), as floats with ``INF`` for unbounded."""
    left, right = (-1, -1) if window_size is None else window_size
    if causal:
        right = 0
    return (INF if left == -1 else float(left), INF if right == -1 else float(right))


@functools.lru_cache(maxsize=256)
def last_step(world: int, c: int, *, zigzag: bool, left: float, right: float) -> int:
    """The last ring step any rank has a call at: K/V need not travel further (a window's far steps)."""
    return max(s for r in range(world) for s, blocks in enumerate(ring_steps(r, world, c, zigzag=zigzag, left=left,
                                                                              right=right)) if blocks)


@functools.lru_cache(maxsize=256)
def ring_steps(rank: int, world: int, c: int, *, zigzag: bool, left: float, right: float) -> tuple:
    """Per ring step ``s`` (the K/V of rank ``(rank - s) % world``): the calls, first the
    pairs of the local query chunks in order. Sinks go to each query chunk's call on its own keys
    (step 0): a band holds its diagonal, so that call has every row of the chunk."""
    mine = chunks_of(rank, world, zigzag)
    steps = []
    for s in range(world):
        src = (rank - s) % world
        blocks = []
        for qc in mine:
            for kc in chunks_of(src, world, zigzag):
                b = pair_block(qc, kc, c, left, right)
                if b is not None:
                    blocks.append(b)
        steps.append(blocks)
    for i, b in enumerate(steps[0]):
        if b.k_chunk == b.q_chunk:  # whole rows: a band always holds its diagonal
            steps[0][i] = Block(b.q_chunk, b.k_chunk, b.qa, b.qb, b.ka, b.kb, b.causal, b.window, True)
    return tuple(tuple(blocks) for blocks in steps)  # cached: every call of one problem shares it
