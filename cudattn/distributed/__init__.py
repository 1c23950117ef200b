"""Attention over a sequence spread across GPUs (context parallelism), over NCCL.

Installed with ``pip install "cudattn[distributed]"`` (nccl4py and NVIDIA's NCCL); ``import
cudattn`` never imports this package, and only :func:`ring_attention` needs nccl4py.

- :mod:`.schedule`: which local attention calls each rank makes at each ring step (pure arithmetic);
- :mod:`.sharding`: cutting a host sequence into the ranks' shards (zigzag for causal) and back;
- :mod:`.ring`: the ring itself, K/V passed rank to rank by NCCL while the local calls run.
"""

from __future__ import annotations

from .ring import ring_attention
from .sharding import gather_sequence, shard_sequence

__all__ = ["ring_attention", "shard_sequence", "gather_sequence"]
