"""CPU: the bookkeeping of the memory streams keep (`_stream_memory`), with the driver faked.

What the GPU tests cannot show cheaply: a counters block is taken and zeroed once per stream and
reused, grown by doubling with the old one retired (not freed: earlier kernels may still count in
it), never freed on the stream it served (its owner may have destroyed it), freed by `release` on
cudattn's own stream and waited for; a capturing stream gets the graph's own counters each call;
a recorded call gets a placeholder. Workspaces: kept per stream and reused with no memset, the
large ones and those past the device's budget the call's own, as are a capturing stream's.
"""

from __future__ import annotations

import types

import pytest

from cudattn._runtime import recording as _recording
from cudattn._arrays import stream_memory as sm
from cudattn._runtime import stream as _stream

CALL_STREAM, OTHER_STREAM, LIBRARY_STREAM = 0x1000, 0x2000, 0x3000


class _FakeDriver:
    """Just the calls `_stream_memory` makes, logged."""

    def __init__(self):
        self.log = []
        self.ids = {}

    def cuMemsetD32Async(self, ptr, value, count, stream):
        self.log.append(("memset", ptr, value, count, stream))
        return (0,)

    def cuMemFreeAsync(self, ptr, stream):
        self.log.append(("free", ptr, stream))
        return (0,)

    def cuStreamSynchronize(self, stream):
        self.log.append(("sync", stream))
        return (0,)

    def cuStreamGetId(self, stream):  # a destroyed stream's handle given to a new stream: a new id
        self.log.append(("id", stream))
        return (0, self.ids.get(stream, stream + 7))


@pytest.fixture
def fake(monkeypatch):
    drv = _FakeDriver()
    state = types.SimpleNamespace(capturing=set(), next_ptr=0x10000, allocs=[], drv=drv)

    class Block:
        def __init__(self, ptr, nbytes, stream):
            self.ptr, self.nbytes, self.stream = ptr, nbytes, stream

    def allocate(device_id, nbytes, stream, keep=None, reuse=False):
        state.next_ptr += 1 << 20
        state.allocs.append((state.next_ptr, nbytes, stream))
        return Block(state.next_ptr, nbytes, stream)

    monkeypatch.setattr(sm, "driver", drv)
    monkeypatch.setattr(sm._alloc, "allocate", allocate)
    monkeypatch.setattr(_stream, "is_capturing", lambda s: s in state.capturing)
    monkeypatch.setattr(sm, "_blocks", {})
    monkeypatch.setattr(sm, "_retired", [])
    monkeypatch.setattr(sm, "_workspace_bytes", {})
    monkeypatch.setattr(_stream, "_default_stream_ref", lambda d: types.SimpleNamespace(handle=LIBRARY_STREAM))
    # the streams these tests name stay the same streams (bare handles that may not: below)
    monkeypatch.setattr(_stream, "LASTING_STREAMS", {1, CALL_STREAM, OTHER_STREAM, LIBRARY_STREAM})
    return state


def test_one_zeroed_block_per_stream_reused_without_a_memset(fake):
    a = sm.counters(0, CALL_STREAM, 10)
    assert a.count == sm._MIN_COUNTERS and fake.allocs == [(a.ptr, 4 * a.count, CALL_STREAM)]
    assert fake.drv.log == [("memset", a.ptr, 0, a.count, CALL_STREAM)]
    assert sm.counters(0, CALL_STREAM, 900) is a  # fits: no allocation, no memset
    b = sm.counters(0, OTHER_STREAM, 10)
    assert b is not a and b.ptr != a.ptr  # streams never share counters
    assert len(fake.drv.log) == 2


def test_a_larger_grid_doubles_the_block_and_retires_the_old_one(fake):
    a = sm.counters(0, CALL_STREAM, 10)
    b = sm.counters(0, CALL_STREAM, a.count + 1)
    assert b.count == 2 * a.count and sm._retired == [a]
    assert not [x for x in fake.drv.log if x[0] == "free"], "an outgrown block was freed while kernels may use it"


def test_a_block_made_meanwhile_by_another_thread_is_retired_not_lost(fake, monkeypatch):
    other = sm._Kept(0xBEEF00, 4096, 0, None)
    real = sm._raw_alloc

    def racing_alloc(device_id, nbytes, stream):  # another thread fills the key while this one allocates
        sm._blocks[(device_id, stream, sm._COUNTERS)] = other
        return real(device_id, nbytes, stream)

    monkeypatch.setattr(sm, "_raw_alloc", racing_alloc)
    mine = sm.counters(0, CALL_STREAM, 10)
    assert sm._blocks[(0, CALL_STREAM, sm._COUNTERS)] is mine and sm._retired == [other]
    sm.release(0)
    assert {mine.ptr, other.ptr} <= {x[1] for x in fake.drv.log if x[0] == "free"}


def test_release_frees_everything_on_the_library_stream_and_waits(fake):
    a = sm.counters(0, CALL_STREAM, 10)
    b = sm.counters(0, CALL_STREAM, 5000)
    c = sm.counters(0, OTHER_STREAM, 10)
    d = sm.counters(1, OTHER_STREAM, 10)  # another device: kept
    fake.drv.log.clear()
    sm.release(0)
    frees = [x for x in fake.drv.log if x[0] == "free"]
    assert sorted(p for _, p, _ in frees) == sorted([a.ptr, b.ptr, c.ptr])
    assert {s for _, _, s in frees} == {LIBRARY_STREAM}, "a block was freed on the stream it served"
    assert fake.drv.log[-1] == ("sync", LIBRARY_STREAM)
    assert list(sm._blocks.values()) == [d] and not sm._retired


def test_a_full_table_starts_over_retiring_its_blocks(fake, monkeypatch):
    monkeypatch.setattr(sm, "_MAX_BLOCKS", 3)
    made = [sm.counters(0, 0x100 * (i + 1), 10) for i in range(4)]
    assert list(sm._blocks.values()) == [made[3]] and sm._retired == made[:3]


def test_a_capturing_stream_gets_the_graphs_own_counters_each_call(fake):
    fake.capturing.add(CALL_STREAM)
    a = sm.counters(0, CALL_STREAM, 10)
    b = sm.counters(0, CALL_STREAM, 10)
    assert a is not b and not sm._blocks, "the graph must not bake in the stream's eager counters"
    assert [x[0] for x in fake.drv.log] == ["memset", "memset"] and fake.drv.log[0][3] == 10


def test_a_recorded_call_gets_a_placeholder(fake):
    with _recording.Recorder(3, _recording.BASES[0]) as rec:
        p = sm.counters(0, CALL_STREAM, 77)
    assert _recording.slot_of(p.ptr, rec.base) == (3, 0)
    assert rec.allocations == [((77,), _recording.COUNTERS, None)]
    assert not fake.allocs and not fake.drv.log


def test_a_workspace_is_kept_per_stream_and_reused_without_a_memset(fake):
    a = sm.workspace(0, CALL_STREAM, 1000)
    assert a.nbytes == sm._MIN_WORKSPACE and fake.allocs == [(a.ptr, a.nbytes, CALL_STREAM)]
    assert sm.workspace(0, CALL_STREAM, a.nbytes) is a  # fits: nothing asked of the driver
    b = sm.workspace(0, OTHER_STREAM, 1000)
    assert b.ptr != a.ptr, "two streams' calls may run at once: they must not share a workspace"
    c = sm.counters(0, CALL_STREAM, 10)
    assert c.ptr not in (a.ptr, b.ptr), "counters and workspace of one stream must not share a block"
    assert not fake.drv.log[:-1] and fake.drv.log[-1][0] == "memset", "a workspace was zeroed or freed"


def test_a_workspace_grows_by_doubling_up_to_the_cap_and_retires_the_old_one(fake):
    first = sm.workspace(0, CALL_STREAM, 10)
    a = sm.workspace(0, CALL_STREAM, first.nbytes + 1)
    assert a.nbytes == 2 * first.nbytes
    b = sm.workspace(0, CALL_STREAM, sm.WORKSPACE_KEPT_MAX - 1)
    assert b.nbytes == sm.WORKSPACE_KEPT_MAX and sm._retired == [first, a]
    assert not [x for x in fake.drv.log if x[0] == "free"], "an outgrown workspace was freed while kernels may use it"
    assert sm._workspace_bytes[0] == first.nbytes + a.nbytes + b.nbytes  # retired ones count until `release`


def test_large_workspaces_and_those_past_the_budget_are_the_calls_own(fake, monkeypatch):
    big = sm.workspace(0, CALL_STREAM, sm.WORKSPACE_KEPT_MAX + 1)
    assert not sm._blocks and not isinstance(big, sm._Kept)  # an `_alloc.Block`: freed when dropped
    monkeypatch.setattr(sm, "WORKSPACE_BUDGET", 3 * sm._MIN_WORKSPACE)
    kept = [sm.workspace(0, 0x100 * (i + 1), 10) for i in range(3)]
    assert all(isinstance(k, sm._Kept) for k in kept)
    own = sm.workspace(0, 0x400, 10)
    assert not isinstance(own, sm._Kept) and len(sm._blocks) == 3, "the budget was exceeded"
    assert sm.workspace(0, 0x100, 10) is kept[0]  # a stream that has one keeps using it
    sm.release(0)  # the budget starts over
    assert isinstance(sm.workspace(0, 0x400, 10), sm._Kept)


def test_a_capturing_stream_gets_its_own_workspace_each_call(fake):
    fake.capturing.add(CALL_STREAM)
    a = sm.workspace(0, CALL_STREAM, 1000)
    b = sm.workspace(0, CALL_STREAM, 1000)
    assert a is not b and not sm._blocks, "the graph must not bake in the stream's eager workspace"
    assert [x[1:] for x in fake.allocs] == [(1000, CALL_STREAM)] * 2


def test_release_frees_kept_workspaces_too(fake):
    a = sm.workspace(0, CALL_STREAM, 1000)
    b = sm.workspace(0, CALL_STREAM, sm._MIN_WORKSPACE * 3)
    fake.drv.log.clear()
    sm.release(0)
    assert sorted(x[1] for x in fake.drv.log if x[0] == "free") == sorted([a.ptr, b.ptr])
    assert not sm._blocks and not sm._retired and not sm._workspace_bytes


def test_the_per_thread_stream_keeps_nothing(fake):
    """Handle 2 names a different stream in each thread: a block kept under it would be shared by
    kernels that run at once."""
    a = sm.workspace(0, 2, 1000)
    c = sm.counters(0, 2, 10)
    assert not sm._blocks and not isinstance(a, sm._Kept) and not isinstance(c, sm._Kept)
    assert fake.drv.log == [("memset", c.ptr, 0, 10, 2)]  # the call's own counters, zeroed


def test_a_retired_block_lets_its_streams_owner_go(fake):
    owner = object()
    a = sm.workspace(0, CALL_STREAM, 10, keep=owner)
    assert a.keep is owner
    sm.workspace(0, CALL_STREAM, a.nbytes + 1, keep=owner)
    assert sm._retired == [a] and a.keep is None


@pytest.mark.parametrize("launches", [1, 2])
def test_only_a_single_launch_call_uses_the_kept_workspace(fake, monkeypatch, launches):
    """A workspace one kernel writes and a later kernel of the same call reads (FP8's transposed V)
    must be the call's own: another thread's call on the stream could run between the two."""
    import numpy as np

    from cudattn._calls import replay as _replay

    kept = []
    monkeypatch.setattr(sm, "workspace", lambda d, s, n, keep=None, capturing=None: kept.append(n) or types.SimpleNamespace(ptr=0x9000))
    rep = _replay.Replay(1, [((256,), np.dtype(np.float32), (4,))], [object()] * launches, [0], False)
    ptrs = [0x1000]
    made = rep._allocate(ptrs, 0, CALL_STREAM, None)
    if launches == 1:
        assert kept == [1024] and ptrs[1] == 0x9000 and not fake.allocs
    else:
        assert not kept and fake.allocs == [(ptrs[1], 1024, CALL_STREAM)]
    assert made[-1] is not None  # the scratch is held until the launches are queued


def test_a_block_the_full_table_retired_meanwhile_is_not_retired_twice(fake, monkeypatch):
    """Another thread empties the full table (retiring every block) while this one grows its entry:
    the entry is retired once (freed once by `release`)."""
    a = sm.counters(0, CALL_STREAM, 10)
    real = sm._raw_alloc

    def clearing_alloc(device_id, nbytes, stream):
        for b in sm._blocks.values():
            sm._retire(b)
        sm._blocks.clear()
        return real(device_id, nbytes, stream)

    monkeypatch.setattr(sm, "_raw_alloc", clearing_alloc)
    sm.counters(0, CALL_STREAM, a.count + 1)
    assert sm._retired.count(a) == 1
    sm.release(0)
    frees = [x[1] for x in fake.drv.log if x[0] == "free"]
    assert frees.count(a.ptr) == 1, "a block was freed twice"


def test_a_bare_handle_is_told_apart_by_its_stream_id(fake):
    """A handle with no owner that is not lasting may be destroyed while its kernels run and handed
    to a new stream: the new stream (another id) gets blocks of its own, never the old one's."""
    bare = 0x4000
    a = sm.counters(0, bare, 10)
    w = sm.workspace(0, bare, 1000)
    assert sm.counters(0, bare, 10) is a and sm.workspace(0, bare, 1000) is w  # the same stream
    fake.drv.ids[bare] = 12345  # destroyed; the handle now names a new stream
    b = sm.counters(0, bare, 10)
    assert b is not a and b.ptr != a.ptr and sm.workspace(0, bare, 1000) is not w
    assert ("memset", b.ptr, 0, b.count, bare) in fake.drv.log
    assert not sm._retired, "the old stream's blocks stay its own (its kernels may still run)"


def test_a_handle_with_an_owner_asks_its_id_once_and_a_lasting_one_never(fake):
    owner = object()
    a = sm.counters(0, 0x5000, 10, owner)  # its id noted once, with the block
    for _ in range(3):
        assert sm.counters(0, 0x5000, 10, owner) is a  # the same owner: no more queries
    sm.counters(0, CALL_STREAM, 10)
    assert [x for x in fake.drv.log if x[0] == "id"] == [("id", 0x5000)]


def test_a_stream_object_that_may_not_own_its_stream_is_checked_when_another_object_comes(fake):
    """A stream given with an object keeps its handle's blocks with that object (no id asked while
    the same object comes back). Another object for the same handle (a new `Stream.from_handle`, a
    new CuPy `ExternalStream`) gets them only where the driver gives the stream's id of their
    making: the same stream. A new stream at the handle (another id) gets blocks of its own, and
    the old ones are retired (its kernels may still run), not handed over."""
    h = 0x6000  # not lasting
    first, second, third = object(), object(), object()
    a = sm.counters(0, h, 10, first)
    w = sm.workspace(0, h, 1000, first)
    made = len([x for x in fake.drv.log if x[0] == "id"])
    assert made >= 1, "the stream's id is noted when its block is made"
    assert sm.counters(0, h, 10, first) is a and sm.workspace(0, h, 1000, first) is w
    assert len([x for x in fake.drv.log if x[0] == "id"]) == made, "the same object: no query"
    assert sm.counters(0, h, 10, second) is a and sm.workspace(0, h, 1000, second) is w  # same id: same stream
    fake.drv.ids[h] = 99999  # destroyed; the handle now names a new stream
    b = sm.counters(0, h, 10, third)
    v = sm.workspace(0, h, 1000, third)
    assert b is not a and b.ptr != a.ptr and v is not w
    assert ("memset", b.ptr, 0, b.count, h) in fake.drv.log
    assert a in sm._retired and w in sm._retired and a.keep is None, "the old blocks retired, their owner let go"
    assert sm.counters(0, h, 10, third) is b


def test_a_lasting_streams_block_asks_no_id_whatever_object_brings_it(fake):
    a = sm.counters(0, CALL_STREAM, 10, object())
    assert a.sid is None and sm.counters(0, CALL_STREAM, 10, object()) is a
    assert not [x for x in fake.drv.log if x[0] == "id"]


def test_optional_counters_are_none_while_the_stream_captures(fake):
    """Counters a kernel can do without are a null address in a graph: no memory node, no memset."""
    fake.capturing.add(CALL_STREAM)
    assert sm.counters(0, CALL_STREAM, 2, optional=True).ptr == 0
    assert not fake.allocs and not fake.drv.log
    fake.capturing.clear()
    assert sm.counters(0, CALL_STREAM, 2, optional=True).ptr != 0  # eager: the stream's
    with _recording.Recorder(3, _recording.BASES[0]) as rec:
        p = sm.counters(0, CALL_STREAM, 2, optional=True)
    assert p.ptr != 0 and rec.allocations == [((2,), _recording.OPTIONAL_COUNTERS, None)]
