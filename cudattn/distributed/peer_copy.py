"""The ring's K/V passed by the copy engine between the GPUs of one host: a transfer that needs no SM.

NCCL moves data with a kernel, and a kernel needs SMs, while the Hopper forward kernel keeps one
CTA on every SM for a whole call: on 4 H200s the call that ran beside a transfer slowed by up to
2.6 ms a step, and leaving SMs free for NCCL (``sm_margin``) costs every call its share of them.
Here each rank makes one region per communicator (``cuMemAlloc``): two receive buffers and a few
flags. Its neighbours map it, by CUDA IPC from another process or by address from a thread of
the same one. A step then needs neither SMs nor NCCL, only stream operations the GPU's front end
carries out:

1. write "free" into the previous rank's flags: this rank's buffer b is no longer read;
2. wait until the next rank wrote "free" into this rank's flags;
3. copy K and V into the next rank's buffer b (``cuMemcpyDtoDAsync``: the copy engine);
4. write "done" into the next rank's flags (the write is fenced after the copy);
5. wait until the previous rank wrote "done" here: buffer b holds its K/V.

Flags hold the count of a buffer's uses, the same on every rank because every rank makes the same
calls; waits compare with >= (``cuStreamWaitValue32``, wrap-safe). The ranks decide together
whether they can share regions (two all-gathers when a communicator first needs buffers of a
size), so that all of them take the same path.

A region lives as long as the process, or until a larger call replaces it (the ranks then drop
the old one together: an exporter may not free memory a peer still maps).

A peer that fails mid-ring leaves this rank's stream waiting on a flag no one will write, which no
NCCL abort ends. :func:`release` (called by `synchronize` before its abort, which waits for the
device) writes this rank's flags itself, past every count a queued step waits for, from a stream
of its own: the waits end, the stream runs again, and the buffers are not used again (what they
received is garbage).
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import uuid
import weakref
import zlib

import numpy as np
from cuda.bindings import driver
from cuda.core import StreamOptions

from .._arrays.array import DeviceArray
from .._runtime.device import get_device
from .._runtime.errors import check
from .agree import all_gather_rows

_HANDLE = driver.CU_IPC_HANDLE_SIZE  # bytes of a CUipcMemHandle
_FREE, _DONE, _DATA = 0, 128, 256  # offsets in a region: flags (a cache line each kind), then two buffers
_ALIGN = 256  # V starts this aligned after K in a buffer (TMA wants 16)
_GEQ = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
_FENCED = driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT  # after the stream's earlier writes
_PROCESS = uuid.uuid4().int & ((1 << 63) - 1)  # this process, told apart from others of one host
_lock = threading.Lock()
_by_comm: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # communicator -> PeerBuffers or _NONE
_NONE = object()  # the ranks cannot share regions: another host, no peer access, no stream memory operations
_WORDS = 6 + _HANDLE // 8  # a rank's row: host, ok, process, device, region address, memops; its IPC handle


def host_id() -> int:
    """This host, as an int: its name and boot (two containers of one name on two machines differ)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return zlib.crc32(f"{socket.gethostname()}/{boot}".encode())


def layout(k: DeviceArray, v: DeviceArray) -> tuple[int, int]:
    """(offset of V, bytes) of a buffer holding ``k`` then ``v``."""
    off = -(-k.nbytes // _ALIGN) * _ALIGN
    return off, -(-(off + v.nbytes) // _ALIGN) * _ALIGN


class PeerBuffers:
    """This rank's region (``mine``) and its neighbours' as mapped here (``prev``, ``succ``), each two
    buffers of ``nbytes`` after the flags; ``uses`` counts each buffer's transfers."""

    def __init__(self, device_id: int, nbytes: int, mine: int, prev: int, succ: int, opened: list | None = None):
        self.device_id, self.nbytes, self.mine, self.prev, self.succ = device_id, nbytes, mine, prev, succ
        self.opened = opened if opened is not None else []  # the neighbours' regions this process mapped by IPC
        self.uses = [0, 0]
        self.released = False  # after a failed wait (release): no step may use the buffers again

    def buffer(self, region: int, b: int) -> int:
        return region + _DATA + b * self.nbytes

    def pass_on(self, srcs: tuple, b: int, stream: int, what: str) -> None:
        """Queue on ``stream`` the step that copies ``srcs`` (K, V) into the next rank's buffer ``b``
        and receives the previous rank's into this one's (steps 1-5 above). ``stream`` must already
        follow the calls that read this rank's buffer ``b``."""
        v_at, used = layout(*srcs)
        if self.released:
            raise RuntimeError(f"{what}: this communicator's copy-engine buffers were released after a failed "
                               "wait (a peer that failed); make a new communicator")
        if used > self.nbytes:
            raise ValueError(f"{what}: K/V of {used} bytes do not fit the ring's {self.nbytes}-byte buffers")
        self.uses[b] += 1
        n = self.uses[b] & 0xFFFFFFFF
        flag = 4 * b
        write_value(self.prev + _FREE + flag, n, stream)
        wait_value(self.mine + _FREE + flag, n, stream)
        for x, at in zip(srcs, (0, v_at)):
            copy(self.buffer(self.succ, b) + at, x.ptr, x.nbytes, stream)
        write_value(self.succ + _DONE + flag, n, stream)
        wait_value(self.mine + _DONE + flag, n, stream)

    def views(self, b: int, like: tuple) -> tuple:
        """This rank's buffer ``b`` as arrays shaped as ``like`` (K, V)."""
        base = self.buffer(self.mine, b)
        return tuple(DeviceArray(base + at, x.shape, x.dtype, device_id=self.device_id, owner=self)
                     for x, at in zip(like, (0, layout(*like)[0])))

    def release(self) -> None:
        """Let every wait on this rank's flags end: each flag set 2**30 past its buffer's count of uses
        (the waits compare wrap-safe, so every count queued so far is passed), written from a
        non-blocking stream of its own, which the blocked stream does not hold up."""
        self.released = True
        with side_stream(self.device_id) as stream:
            for b in (0, 1):
                n = (self.uses[b] + (1 << 30)) & 0xFFFFFFFF
                for kind in (_FREE, _DONE):
                    write_value(self.mine + kind + 4 * b, n, stream)


def release(comm) -> bool:
    """After a failed wait on ``comm``'s work (`synchronize`, before it aborts the communicator): the
    copy engine's ring steps this rank queued go past their flags (`PeerBuffers.release`), so that
    its streams run again. Whether ``comm`` had such buffers."""
    with _lock:
        try:
            bufs = _by_comm.get(comm)
        except TypeError:  # an object no weak reference can hold was never a key
            bufs = None
    if not isinstance(bufs, PeerBuffers):
        return False
    bufs.release()
    return True


@contextlib.contextmanager
def side_stream(device_id: int):
    """A non-blocking stream of device ``device_id`` for the duration (its handle), synchronised
    before it goes. Not the library's stream of that device: that may be the one blocked."""
    stream = get_device(device_id).create_stream(options=StreamOptions(nonblocking=True))
    try:
        yield int(stream.handle)
        stream.sync()
    finally:
        stream.close()


def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
    """``nbytes`` from ``src`` to ``dst`` (a peer's memory mapped here) on ``stream``: the copy engine."""
    check(driver.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync (K/V to the next rank)")


def write_value(addr: int, value: int, stream: int) -> None:
    check(driver.cuStreamWriteValue32(stream, addr, value, _FENCED), "cuStreamWriteValue32 (a ring flag)")


def wait_value(addr: int, value: int, stream: int) -> None:
    check(driver.cuStreamWaitValue32(stream, addr, value, _GEQ), "cuStreamWaitValue32 (a ring flag)")


def buffers_for(comm, nb, handle, u8: int, device_id: int, stream: int, nbytes: int, what: str):
    """``(PeerBuffers of at least nbytes, None)``, made collectively (every rank calls this with the
    same ``nbytes``) when the communicator has none that large; ``(None, why)`` when the ranks
    cannot share regions, which every rank then learns together."""
    with _lock:
        have = _by_comm.get(comm)
    if have is _NONE:
        return None, ("the ranks found they cannot share memory (another host, no peer access or no stream "
                      "memory operations)")
    if have is not None and have.nbytes >= nbytes:
        return have, None
    world, rank = int(comm.nranks), int(comm.rank)
    get_device(device_id)
    if have is not None:  # replaced: no copy may still run, nor a mapping of a neighbour's old region stay
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize (before the ring's buffers grow)")
        _unmap(have.device_id, have.opened)
    region, raw = _allocate(_DATA + 2 * nbytes, stream)
    row = np.zeros(_WORDS, np.int64)
    memops = region is not None and _memops(region, stream)
    row[:6] = host_id(), region is not None, _PROCESS, device_id, region or 0, memops
    if raw is not None:
        row[6:] = np.frombuffer(raw, np.int64)
    rows = all_gather_rows(nb, handle, u8, world, row, device_id, stream, what)  # also: every old mapping closed
    if have is not None:
        check(driver.cuMemFree(have.mine), "cuMemFree (the ring's old buffers)")
    why = None
    if not (rows[:, 0] == rows[0, 0]).all():
        why = "the ranks are not all on one host"
    elif not rows[:, 1].all():
        why = "a rank could not allocate the ring's buffers"
    elif not rows[:, 5].all():
        why = "a GPU without stream memory operations (cuStreamWaitValue32)"
    mapped = None if why else _map(rows, rank, world, device_id)
    opened = all_gather_rows(nb, handle, u8, world, np.array([mapped is not None], np.int64), device_id, stream, what)
    if why is None and not opened.all():
        why = "a rank could not map its neighbours' memory (CUDA IPC or peer access refused)"
    if why is not None:
        if mapped is not None:
            _unmap(device_id, mapped[2])
        if region is not None:
            check(driver.cuMemFree(region), "cuMemFree (the ring's buffers, not shared)")
        with _lock:
            if why != "a rank could not allocate the ring's buffers":  # that one may pass next time
                _by_comm[comm] = _NONE
            else:
                _by_comm.pop(comm, None)
        return None, why
    bufs = PeerBuffers(device_id, nbytes, region, *mapped)
    fin = weakref.finalize(bufs, _unmap, device_id, bufs.opened)  # the region itself stays (see above)
    fin.atexit = False
    with _lock:
        _by_comm[comm] = bufs
    return bufs, None


def _memops(region: int, stream: int) -> bool:
    """Whether this GPU takes stream memory operations: one write and one wait, on a spare flag (the
    driver's attribute for them names the old API only)."""
    spare = region + _DONE + 64
    ok = driver.CUresult.CUDA_SUCCESS
    return (driver.cuStreamWriteValue32(stream, spare, 0, _FENCED)[0] == ok
            and driver.cuStreamWaitValue32(stream, spare, 0, _GEQ)[0] == ok)


def _allocate(nbytes: int, stream: int):
    """(region address, its IPC handle's bytes), or (None, None) where the driver refuses
    (``cuMemAlloc``: pool memory has no legacy IPC handle). The flags are zeroed on ``stream``,
    which the all-gather that follows waits for: before any neighbour can write one."""
    err, ptr = driver.cuMemAlloc(nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        return None, None
    ptr = int(ptr)
    err, h = driver.cuIpcGetMemHandle(ptr)
    if err != driver.CUresult.CUDA_SUCCESS or \
            driver.cuMemsetD8Async(ptr, 0, _DATA, stream)[0] != driver.CUresult.CUDA_SUCCESS:
        driver.cuMemFree(ptr)
        return None, None
    return ptr, ctypes.string_at(h.getPtr(), _HANDLE)  # read while `h` lives: the bytes are inside it


def _map(rows: np.ndarray, rank: int, world: int, device_id: int):
    """(previous rank's region, next rank's region, the addresses opened by IPC) as seen here, or None
    where the driver refuses. A thread of this process is reached by its address, with peer access."""
    got: dict[int, int] = {}
    opened: list[int] = []
    try:
        for r in ((rank - 1) % world, (rank + 1) % world):
            if r in got:  # two ranks: the previous is the next
                continue
            if rows[r, 2] == _PROCESS:
                if not _enable_peer(device_id, int(rows[r, 3])):
                    raise RuntimeError("no peer access")
                got[r] = int(rows[r, 4])
            else:
                h = driver.CUipcMemHandle()
                ctypes.memmove(h.getPtr(), rows[r, 6:].tobytes(), _HANDLE)
                flag = driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
                got[r] = int(check(driver.cuIpcOpenMemHandle(h, flag), "cuIpcOpenMemHandle"))
                opened.append(got[r])
    except Exception:  # noqa: BLE001 (the ranks then agree on NCCL)
        for p in opened:
            driver.cuIpcCloseMemHandle(p)
        return None
    return got[(rank - 1) % world], got[(rank + 1) % world], opened


def _enable_peer(device_id: int, peer_id: int) -> bool:
    """This context reads and writes ``peer_id``'s memory directly (NVLink or PCIe), if it can."""
    if peer_id == device_id:
        return True
    try:
        if not get_device(device_id).can_access_peer(peer_id):
            return False
        ctx = check(driver.cuDevicePrimaryCtxRetain(driver.CUdevice(peer_id)), "cuDevicePrimaryCtxRetain")
    except Exception:  # noqa: BLE001
        return False
    try:
        err = driver.cuCtxEnablePeerAccess(ctx, 0)[0]
        return err in (driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    finally:
        driver.cuDevicePrimaryCtxRelease(driver.CUdevice(peer_id))


def _unmap(device_id: int, opened: list[int]) -> None:
    """Close the IPC mappings of neighbours' regions, in this device's context, leaving the thread's
    current context as it was."""
    if not opened:
        return
    try:
        ctx = check(driver.cuDevicePrimaryCtxRetain(driver.CUdevice(device_id)), "cuDevicePrimaryCtxRetain")
        check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            for p in opened:
                driver.cuIpcCloseMemHandle(p)
        finally:
            driver.cuCtxPopCurrent()
            driver.cuDevicePrimaryCtxRelease(driver.CUdevice(device_id))
    except Exception:  # noqa: BLE001 (interpreter shutdown: the driver may be gone)
        pass
    opened.clear()
