"""`synchronize`: the wait that ends a rank's part of failed collective work, and what it leaves
behind. A timeout or an error aborts the communicator (NCCL's kernels end) and lets the copy
engine's ring steps go past their flags (:func:`cudattn.distributed.peer_copy.release`), so that
the stream runs again; the results of the failed calls are then garbage.
"""

from __future__ import annotations

from .._runtime.device import get_device, restores_caller_context
from .._runtime.stream import as_stream
from . import peer_copy
from .nccl_lib import nccl
from .watch import ABORT, wait


@restores_caller_context
def synchronize(comm, stream=None, *, timeout: float | None = None, abort: bool = True) -> None:
    """Wait on the host until the work queued on ``stream`` has finished, for at most ``timeout``
    seconds (default ``CUDATTN_NCCL_TIMEOUT``, else 600).

    Use it in place of a stream synchronisation after the calls of this package when a rank may
    fail: a stream that waits for a peer that died never finishes, and a plain synchronisation
    would wait forever. ``stream``: the stream the calls ran on (their ``stream``, or q's), as
    anything they take (a cuda.core stream, a torch or CuPy stream, a handle); default the device's
    own stream. The deadline covers all the work queued on the stream, so it must exceed what that
    work takes. While it waits it watches ``comm``'s error state, so an error NCCL reports (a peer
    it saw fail) ends the wait at once.

    On a timeout (TimeoutError) or an error (RuntimeError: NCCL's, or the driver's) it aborts
    ``comm`` first (``comm.abort()``: its kernels end, the stream's later work can run, and the
    communicator can no longer be used), unless ``abort=False``, which leaves that to you. A ring
    with ``transport="copy"`` waits on flags in the ranks' memory, not in NCCL: with the abort, this
    rank's flags are set past every count its steps wait for, so that those waits end as well and
    the copy engine's buffers of ``comm`` are not used again (with ``abort=False`` those waits stay).
    """
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"synchronize: timeout must be a positive number of seconds (or None); got {timeout!r}")
    _, nb = nccl()
    dev = int(comm.device.device_id)
    get_device(dev)
    wait_or_abort(nb, comm, as_stream(stream, dev).handle, timeout, abort)


def wait_or_abort(nb, comm, stream: int, timeout: float | None, abort: bool) -> None:
    """`synchronize` once the stream is known: `wait`, and on its error the release of the copy
    engine's flags and ``comm.abort()`` before the error goes on (an error of either is raised
    instead, this one as its context)."""
    try:
        wait(nb, nb.Comm(int(comm.ptr)), stream, "synchronize", timeout,
             "the communicator was aborted" if abort else ABORT)
    except (TimeoutError, RuntimeError):  # the driver's CudaError too
        if abort:
            # the flags first: NCCL's abort waits for the device, which a stream held on a flag never frees
            peer_copy.release(comm)
            comm.abort()
        raise
