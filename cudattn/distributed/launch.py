"""One process per GPU on this host, joined by one NCCL communicator: :func:`run`.

The parent makes the NCCL unique id and starts ``world`` processes (``spawn``: no CUDA state is
inherited); rank r makes GPU ``devices[r]`` current, joins the communicator and runs
``fn(comm, *args)``. A rank that raises, dies or outlives ``timeout`` stops them all (the others may
be waiting in NCCL for it), and :func:`run` raises :class:`RankError` naming it. Across hosts,
start one process per GPU with mpirun or srun instead and pass the unique id yourself (see
docs/DISTRIBUTED.md); NCCL crosses hosts, nothing here is host-specific.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence

from .._runtime.device import get_device
from . import agree

#: NVLink multicast stays off (shared machines turn it off; a program that uses it can take the
#: host's GPUs out of service): set in every rank unless the caller's environment says otherwise.
NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0"}


class RankError(RuntimeError):
    """A rank failed, died or timed out; ``rank`` says which (None: several timed out)."""

    def __init__(self, rank: int | None, message: str):
        self.rank = rank
        super().__init__(message)


def _rank_main(fn, rank: int, world: int, device: int, uid: bytes, args: tuple, results, env: dict) -> None:
    for k, v in {**NCCL_DEFAULTS, **env}.items():
        os.environ.setdefault(k, v)
    comm = None
    try:
        nccl, _ = agree.nccl()
        get_device(device)  # NCCL joins on the current device
        comm = nccl.Communicator.init(world, rank, nccl.UniqueId.from_bytes(uid))
        value = fn(comm, *args)
    except BaseException as e:  # noqa: BLE001 (sent to the parent, which raises it by rank)
        # reported first: destroying a communicator waits for the other ranks, which may wait for this one
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        if comm is not None:
            comm.abort()
        return
    results.put((rank, True, value))
    comm.destroy()


def run(fn: Callable, world: int, *args, devices: Sequence[int] | None = None, timeout: float = 600.0,
        env: dict[str, str] | None = None) -> list:
    """``fn(comm, *args)`` on ``world`` GPUs, one process each; the ranks' results in rank order.

    ``fn`` must be importable by the child processes (a module-level function); ``args`` and the
    results travel by pickle. ``devices``: the GPU of each rank (default ``0 .. world-1``). ``env``:
    environment variables for the ranks (NCCL's settings, say), where the caller's environment
    does not set them already.
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be an int >= 1; got {world!r}")
    devices = list(range(world)) if devices is None else [int(d) for d in devices]
    if len(devices) != world or len(set(devices)) != world:
        raise ValueError(f"devices must name {world} distinct GPUs; got {devices}")
    nccl, _ = agree.nccl()
    uid = bytes(nccl.get_unique_id())
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    env = dict(env or {})
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world, devices[r], uid, args, results, env), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and not p.is_alive() and p.exitcode]
                if dead:
                    raise RankError(dead[0], f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode})") from None
                if time.monotonic() > deadline:
                    left = [r for r in range(world) if r not in got]
                    raise RankError(left[0] if len(left) == 1 else None,
                                    f"ranks {left} did not finish within {timeout:g} s") from None
                continue
            if not ok:
                raise RankError(rank, f"rank {rank} failed: {value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10 if len(got) == world else 0.1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [got[r] for r in range(world)]
