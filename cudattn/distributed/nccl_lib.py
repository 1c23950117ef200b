"""nccl4py, the optional extra every NCCL call of this package goes through, imported on first use."""

from __future__ import annotations


def nccl():
    """nccl4py's ``(nccl.core, nccl.bindings.nccl)``; ImportError naming the extra without it."""
    try:
        import nccl.bindings.nccl as bindings
        import nccl.core as core
    except ImportError as e:  # the optional extra
        raise ImportError('cudattn.distributed needs nccl4py: pip install "cudattn[distributed]"') from e
    return core, bindings
