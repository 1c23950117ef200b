"""Host waits on NCCL work that always end. A peer that died or hangs leaves a communicator that
never takes a call (:func:`settle`), or a stream whose NCCL kernels never finish (:func:`wait`,
behind the public `synchronize` in :mod:`.recover`): a plain synchronisation would wait forever.
Each wait here polls with a deadline (``CUDATTN_NCCL_TIMEOUT`` seconds, default 600), watches
NCCL's own error state while it waits, and raises naming the call.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from cuda.bindings import driver

from .._runtime.errors import check
from .._runtime.launch import Event

TIMEOUT_ENV = "CUDATTN_NCCL_TIMEOUT"
_IN_PROGRESS = 7  # ncclInProgress
_NOT_READY = driver.CUresult.CUDA_ERROR_NOT_READY
ABORT = "abort the communicator"  # what a caller must do after a failed wait
# The longest sleep between two polls: what a wait may add to a healthy stream's end, against a
# poll's ~2 µs of host time (1 % of a core at this pace).
_MAX_PAUSE_S = 2e-4


def timeout_s() -> float:
    """The deadline of every wait here, in seconds: ``CUDATTN_NCCL_TIMEOUT`` (read at each wait, so a
    program may set it late), default 600; ValueError naming the variable when it is not a positive number."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None or not text.strip():
        return 600.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:  # NaN too
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds; got {text!r}")
    return value


def _nccl_error(nb, state: int, what: str, then: str = ABORT) -> RuntimeError:
    try:
        name = nb.Result(state).name
    except Exception:  # no enum, or a code it does not know
        name = "an error"
    return RuntimeError(f"{what}: NCCL reported {name} ({state}); {then}")


def _state(nb, handle, what: str, then: str = ABORT) -> int:
    """NCCL's state of the communicator (0, ncclInProgress or an error code); an error of the query
    itself (nccl4py's NCCLError) as RuntimeError naming ``what``."""
    try:
        return int(nb.comm_get_async_error(handle))
    except Exception as e:
        if _is_nccl_error(nb, e):
            raise RuntimeError(f"{what}: NCCL reported {e}; {then}") from e
        raise


def _is_nccl_error(nb, e: BaseException) -> bool:
    kind = getattr(nb, "NCCLError", None)
    return isinstance(kind, type) and isinstance(e, kind)


def _poll(done: Callable[[], bool], nb, handle, what: str, waiting_for: str, timeout: float | None,
          then: str = ABORT) -> None:
    """Poll ``done()`` and NCCL's state of ``handle`` until ``done()`` holds; RuntimeError for an
    error NCCL reports, TimeoutError after ``timeout`` seconds (default :func:`timeout_s`); ``then``
    ends their messages (what the caller must do next)."""
    limit = timeout_s() if timeout is None else float(timeout)
    deadline = time.monotonic() + limit
    pause = 1e-5
    while not done():
        state = _state(nb, handle, what, then)
        if state not in (0, _IN_PROGRESS):
            raise _nccl_error(nb, state, what, then)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {waiting_for} after {limit:g} s (a rank that never joined, or one that "
                               f"failed); {then}")
        time.sleep(pause)
        pause = min(pause * 2, _MAX_PAUSE_S)


def settle(nb, handle, what: str, timeout: float | None = None) -> None:
    """After an NCCL call (a group's end, a collective): on a non-blocking communicator, wait on the
    host until NCCL has taken it, as NCCL requires before the next NCCL call or any work on its
    streams. A blocking communicator has always taken it (one query). Raises TimeoutError after the
    deadline, or RuntimeError for an error NCCL reports; either way the communicator must then be
    aborted (``comm.abort()``; `launch.run` does it), as nothing it had queued can be trusted."""
    state = [_state(nb, handle, what)]
    if state[0] == 0:
        return
    if state[0] != _IN_PROGRESS:
        raise _nccl_error(nb, state[0], what)

    def taken() -> bool:
        state[0] = _state(nb, handle, what)
        return state[0] != _IN_PROGRESS

    _poll(taken, nb, handle, what, "NCCL had not taken the call", timeout)
    if state[0] != 0:
        raise _nccl_error(nb, state[0], what)


@contextlib.contextmanager
def nccl_call(nb, handle, what: str):
    """Around the NCCL calls of one operation (a collective, or a group's calls up to its end): an
    error NCCL reports from a call (nccl4py's ``NCCLError``: a peer NCCL saw exit, say) raised as
    RuntimeError naming ``what``, and the operation settled after (`settle`)."""
    try:
        yield
    except Exception as e:
        if _is_nccl_error(nb, e):
            raise RuntimeError(f"{what}: NCCL reported {e}; {ABORT}") from e
        raise
    settle(nb, handle, what)


@contextlib.contextmanager
def nccl_group(nb, handle, what: str):
    """One NCCL group (``group_start`` ... ``group_end``) around the point-to-point calls of one
    operation, inside :func:`nccl_call`. The group is ended even when a call in it fails: NCCL's
    group depth belongs to the thread, and a group left open would swallow every later NCCL call
    the thread makes (on any communicator, a new one after an abort included). The first error is
    the one raised; ``group_end`` also clears NCCL's record of it. An error that is not NCCL's (an
    interrupt between two calls) leaves NCCL nothing to refuse: ending the group queues its calls
    so far, half an exchange that peers may wait on, so it comes out as RuntimeError saying to
    abort the communicator (KeyboardInterrupt and other BaseExceptions pass as they are)."""
    with nccl_call(nb, handle, what):
        nb.group_start()
        try:
            yield
        except BaseException as e:
            with contextlib.suppress(Exception):
                nb.group_end()
            if isinstance(e, Exception) and not _is_nccl_error(nb, e):
                raise RuntimeError(f"{what}: {type(e).__name__} inside an NCCL group, whose calls so far were "
                                   f"queued; {ABORT}") from e
            raise
        nb.group_end()


def event_done(event: Event) -> bool:
    """Whether the work before ``event`` has finished (a failed one raises CudaError)."""
    err = driver.cuEventQuery(event.handle)
    err = err[0] if type(err) is tuple else err
    if err == _NOT_READY:
        return False
    check(err, "cuEventQuery")
    return True


def wait(nb, handle, stream: int, what: str, timeout: float | None = None, then: str = ABORT) -> None:
    """Wait on the host for the work queued on ``stream`` so far, NCCL's included, as a stream
    synchronisation would, but ending: TimeoutError after the deadline, RuntimeError as soon as NCCL
    reports an error (the communicator must then be aborted; its kernels hold the stream until then)."""
    ev = Event(stream).record(stream)
    _poll(lambda: event_done(ev), nb, handle, what, "the stream's work had not finished", timeout, then)
