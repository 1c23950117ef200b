"""Attention over a sequence spread across GPUs (context parallelism), over NCCL.

Installed with ``pip install "cudattn[distributed]"`` (nccl4py and NVIDIA's NCCL); ``import
cudattn`` never imports this package, and only the calls that communicate need nccl4py.

- :mod:`.schedule`: which local attention calls each rank makes at each ring step (pure arithmetic);
- :mod:`.sharding`: cutting a host sequence into the ranks' shards (zigzag for causal) and back;
- :mod:`.ring`: the ring itself, K/V passed rank to rank by NCCL while the local calls run;
  :mod:`.ring_backward`: its gradients, dK/dV travelling with their K/V;
- :mod:`.ulysses`: the all-to-all variant (sequence shards swapped for head shards and back), and its backward;
- :mod:`.watch`: host waits on NCCL work that end (a deadline, NCCL's errors); :mod:`.recover`: `synchronize`;
  :mod:`.nccl_lib`: nccl4py, imported on first use;
- :mod:`.copies`: the 2-D device copies both use; :mod:`.launch`: one process a GPU;
  :mod:`.scaling`: the timed runs behind ``demo --gpus N`` and ``bench --grid distributed``.
"""

from __future__ import annotations

from .ring import ring_attention
from .ring_backward import ring_attention_backward
from .sharding import gather_sequence, shard_sequence
from .ulysses import ulysses_attention, ulysses_attention_backward
from .recover import synchronize

__all__ = ["ring_attention", "ring_attention_backward", "ulysses_attention", "ulysses_attention_backward",
           "shard_sequence", "gather_sequence", "synchronize"]
