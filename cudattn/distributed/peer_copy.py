"""The ring's K/V passed by the copy engine between the GPUs of one host: a transfer that needs no SM.

NCCL moves data with a kernel, and a kernel needs SMs, while the Hopper forward kernel keeps one
CTA on every SM for a whole call: on 4 H200s the call that ran beside a transfer slowed by up to
2.6 ms a step, and leaving SMs free for NCCL (``sm_margin``) costs every call its share of them.
Here each rank makes two receive buffers once per communicator (``cuMemAlloc``), shares them by
CUDA IPC, and its predecessor copies the next step's K/V straight into them
(``cuMemcpyDtoDAsync`` between peers: the copy engine). NCCL carries only two 4-byte messages a
step on the ring's stream, one each way: "free" to the predecessor once the calls that read the
buffer are done, and "done" to the successor once the copy is. Their kernels take one CTA for
microseconds; with ``sm_margin=1`` (``NCCL_MAX_CTAS=1``) they need not wait for a call to end.

Every rank must share one host with its neighbours and reach their buffers: a rank in another
process maps them by CUDA IPC, a rank that is a thread of the same process uses their addresses
(peer access). The ranks decide together (two all-gathers when a communicator first needs buffers
of a size), so that all of them take the same path.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import weakref
import zlib

import numpy as np
from cuda.bindings import driver

from .._arrays.array import DeviceArray
from .._runtime.device import get_device
from .._runtime.errors import check
from .agree import all_gather_rows, settle

_HANDLE = driver.CU_IPC_HANDLE_SIZE  # bytes of a CUipcMemHandle
_ALIGN = 256  # V starts this aligned after K in a buffer (TMA wants 16)
_lock = threading.Lock()
_by_comm: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # communicator -> PeerBuffers or _NONE
_NONE = object()  # the ranks found they cannot share buffers (another host, or IPC refused)


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
    return off, off + v.nbytes


class PeerBuffers:
    """Two receive buffers on this rank (``local``) and the successor's two mapped here (``peer``),
    ``nbytes`` each, and 8 bytes for the messages (``flags``)."""

    def __init__(self, device_id: int, nbytes: int, local: list[int], peer: list[int], flags: int):
        self.device_id, self.nbytes, self.local, self.peer, self.flags = device_id, nbytes, local, peer, flags

    def pass_on(self, nb, handle, u8: int, rank: int, world: int, srcs: tuple, b: int, stream: int,
                what: str) -> None:
        """Copy ``srcs`` (K, V) into the successor's buffer ``b`` once it says it is free, after telling
        the predecessor this rank's buffer ``b`` is; then exchange "done". Queued on ``stream``, which
        must already follow the calls that read this rank's buffer ``b``."""
        prev, succ = (rank - 1) % world, (rank + 1) % world
        v_at, used = layout(*srcs)
        if used > self.nbytes:
            raise ValueError(f"{what}: K/V of {used} bytes do not fit the ring's {self.nbytes}-byte buffers")
        _messages(nb, handle, u8, self.flags, to=prev, frm=succ, stream=stream, what=what)  # "free"
        for x, at in zip(srcs, (0, v_at)):
            copy(self.peer[b] + at, x.ptr, x.nbytes, stream)
        _messages(nb, handle, u8, self.flags, to=succ, frm=prev, stream=stream, what=what)  # "done"

    def views(self, b: int, like: tuple) -> tuple:
        """This rank's buffer ``b`` as arrays shaped as ``like`` (K, V)."""
        offsets = (0, layout(*like)[0])
        return tuple(DeviceArray(self.local[b] + at, x.shape, x.dtype, device_id=self.device_id, owner=self)
                     for x, at in zip(like, offsets))


def _messages(nb, handle, u8: int, flags: int, *, to: int, frm: int, stream: int, what: str) -> None:
    nb.group_start()
    nb.send(flags, 4, u8, to, handle, stream)
    nb.recv(flags + 4, 4, u8, frm, handle, stream)
    nb.group_end()
    settle(nb, handle, what)


def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
    """``nbytes`` from ``src`` to ``dst`` (a peer's memory mapped here) on ``stream``: the copy engine."""
    check(driver.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync (K/V to the next rank)")


def buffers_for(comm, nb, handle, u8: int, device_id: int, stream: int, nbytes: int, what: str):
    """The communicator's `PeerBuffers` of at least ``nbytes``, made (collectively: every rank calls
    this with the same ``nbytes``) when it has none that large; None when the ranks cannot share
    buffers, which every rank then learns together."""
    with _lock:
        have = _by_comm.get(comm)
    if have is _NONE:
        return None
    if have is not None and have.nbytes >= nbytes:
        return have
    world, rank = int(comm.nranks), int(comm.rank)
    get_device(device_id)
    made = _allocate(nbytes)  # (local pointers, flags, handles) or None
    row = np.zeros(_WORDS, np.int64)  # host, ok, process, device, the buffers' addresses, their IPC handles
    row[:4] = host_id(), made is not None, os.getpid(), device_id
    if made is not None:
        row[4:6] = made[0]
        row[6:] = np.frombuffer(b"".join(made[2]), np.int64)
    rows = all_gather_rows(nb, handle, u8, world, row, device_id, stream, what)
    succ = rows[(rank + 1) % world]
    peer, mapped = None, False
    if (rows[:, 0] == rows[0, 0]).all() and rows[:, 1].all():
        if succ[2] == os.getpid():  # a thread of this process: its addresses as they are (UVA)
            peer = [int(p) for p in succ[4:6]] if _enable_peer(device_id, int(succ[3])) else None
        else:
            raw = succ[6:].tobytes()
            peer, mapped = _open([raw[i * _HANDLE:(i + 1) * _HANDLE] for i in range(2)]), True
    opened = all_gather_rows(nb, handle, u8, world, np.array([peer is not None], np.int64), device_id, stream, what)
    unmap = peer if mapped and peer else []
    if not opened.all():
        _release(device_id, made[0] + [made[1]] if made else [], unmap)
        with _lock:
            _by_comm[comm] = _NONE
        return None
    bufs = PeerBuffers(device_id, nbytes, made[0], peer, made[1])
    weakref.finalize(bufs, _release, device_id, made[0] + [made[1]], unmap)
    with _lock:
        _by_comm[comm] = bufs  # the smaller set it replaces goes when its last view does
    return bufs


_WORDS = 6 + 2 * _HANDLE // 8


def _enable_peer(device_id: int, peer_id: int) -> bool:
    """This context reads and writes ``peer_id``'s memory directly (NVLink or PCIe), if it can."""
    if peer_id == device_id:
        return True
    if not get_device(device_id).can_access_peer(peer_id):
        return False
    ctx = check(driver.cuDevicePrimaryCtxRetain(driver.CUdevice(peer_id)), "cuDevicePrimaryCtxRetain")
    try:
        err = driver.cuCtxEnablePeerAccess(ctx, 0)[0]
        return err in (driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    finally:
        driver.cuDevicePrimaryCtxRelease(driver.CUdevice(peer_id))


def _allocate(nbytes: int):
    """Two buffers and the message bytes (``cuMemAlloc``: pool memory has no legacy IPC handle) and
    the buffers' IPC handles; None where the driver refuses."""
    got: list[int] = []
    try:
        for n in (nbytes, nbytes, 8):
            got.append(int(check(driver.cuMemAlloc(n), f"cuMemAlloc({n} bytes)")))
        handles = [ctypes.string_at(check(driver.cuIpcGetMemHandle(p), "cuIpcGetMemHandle").getPtr(), _HANDLE)
                   for p in got[:2]]
    except Exception:  # noqa: BLE001 (the ranks then agree on NCCL transfers)
        for p in got:
            driver.cuMemFree(p)
        return None
    return got[:2], got[2], handles


def _open(handles: list[bytes]):
    """The successor's buffers mapped into this context; None where the driver refuses (no peer
    access, or a process that does not see that GPU)."""
    ptrs: list[int] = []
    try:
        for raw in handles:
            h = driver.CUipcMemHandle()
            ctypes.memmove(h.getPtr(), raw, _HANDLE)
            flag = driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
            ptrs.append(int(check(driver.cuIpcOpenMemHandle(h, flag), "cuIpcOpenMemHandle")))
    except Exception:  # noqa: BLE001
        for p in ptrs:
            driver.cuIpcCloseMemHandle(p)
        return None
    return ptrs


def _release(device_id: int, local: list[int], peer: list[int]) -> None:
    """Unmap the successor's buffers and free ours, once the device is idle (a copy may be in flight)."""
    try:
        get_device(device_id)
        driver.cuCtxSynchronize()
        for p in peer:
            driver.cuIpcCloseMemHandle(p)
        for p in local:
            driver.cuMemFree(p)
    except Exception:  # noqa: BLE001 (interpreter shutdown: the driver may be gone)
        pass
