"""CPU: the bookkeeping of the streams' arrival counters (`_counters`), with the driver faked.

What the GPU tests cannot show cheaply: a block is taken and zeroed once per stream and reused,
grown by doubling with the old one retired (not freed: earlier kernels may still count in it),
never freed on the stream it served (its owner may have destroyed it), freed by `release` on
cudattn's own stream and waited for; a capturing stream gets the graph's own counters each call;
a recorded call gets a placeholder.
"""

from __future__ import annotations

import types

import pytest

from cudattn import _counters, _recording

CALL_STREAM, OTHER_STREAM, LIBRARY_STREAM = 0x1000, 0x2000, 0x3000


class _FakeDriver:
    """Just the calls `_counters` makes, logged."""

    def __init__(self):
        self.log = []

    def cuMemsetD32Async(self, ptr, value, count, stream):
        self.log.append(("memset", ptr, value, count, stream))
        return (0,)

    def cuMemFreeAsync(self, ptr, stream):
        self.log.append(("free", ptr, stream))
        return (0,)

    def cuStreamSynchronize(self, stream):
        self.log.append(("sync", stream))
        return (0,)


@pytest.fixture
def fake(monkeypatch):
    drv = _FakeDriver()
    state = types.SimpleNamespace(capturing=set(), next_ptr=0x10000, allocs=[], drv=drv)

    class Block:
        def __init__(self, ptr, nbytes, stream):
            self.ptr, self.nbytes, self.stream = ptr, nbytes, stream

    def allocate(device_id, nbytes, stream, keep=None):
        state.next_ptr += 1 << 20
        state.allocs.append((state.next_ptr, nbytes, stream))
        return Block(state.next_ptr, nbytes, stream)

    monkeypatch.setattr(_counters, "driver", drv)
    monkeypatch.setattr(_counters._alloc, "allocate", allocate)
    monkeypatch.setattr(_counters._alloc, "is_capturing", lambda s: s in state.capturing)
    monkeypatch.setattr(_counters, "_blocks", {})
    monkeypatch.setattr(_counters, "_retired", [])
    import cudattn._device as dev

    monkeypatch.setattr(dev, "_default_stream_ref", lambda d: types.SimpleNamespace(handle=LIBRARY_STREAM))
    return state


def test_one_zeroed_block_per_stream_reused_without_a_memset(fake):
    a = _counters.counters(0, CALL_STREAM, 10)
    assert a.count == _counters._MIN_COUNT and fake.allocs == [(a.ptr, 4 * a.count, CALL_STREAM)]
    assert fake.drv.log == [("memset", a.ptr, 0, a.count, CALL_STREAM)]
    assert _counters.counters(0, CALL_STREAM, 900) is a  # fits: no allocation, no memset
    b = _counters.counters(0, OTHER_STREAM, 10)
    assert b is not a and b.ptr != a.ptr  # streams never share counters
    assert len(fake.drv.log) == 2


def test_a_larger_grid_doubles_the_block_and_retires_the_old_one(fake):
    a = _counters.counters(0, CALL_STREAM, 10)
    b = _counters.counters(0, CALL_STREAM, a.count + 1)
    assert b.count == 2 * a.count and _counters._retired == [a]
    assert not [x for x in fake.drv.log if x[0] == "free"], "an outgrown block was freed while kernels may use it"


def test_a_block_made_meanwhile_by_another_thread_is_retired_not_lost(fake, monkeypatch):
    other = _counters._Counters(0xBEEF00, 1024, 0, None)
    real = _counters._raw_alloc

    def racing_alloc(device_id, nbytes, stream):  # another thread fills the key while this one allocates
        _counters._blocks[(device_id, stream)] = other
        return real(device_id, nbytes, stream)

    monkeypatch.setattr(_counters, "_raw_alloc", racing_alloc)
    mine = _counters.counters(0, CALL_STREAM, 10)
    assert _counters._blocks[(0, CALL_STREAM)] is mine and _counters._retired == [other]
    _counters.release(0)
    assert {mine.ptr, other.ptr} <= {x[1] for x in fake.drv.log if x[0] == "free"}


def test_release_frees_everything_on_the_library_stream_and_waits(fake):
    a = _counters.counters(0, CALL_STREAM, 10)
    b = _counters.counters(0, CALL_STREAM, 5000)
    c = _counters.counters(0, OTHER_STREAM, 10)
    d = _counters.counters(1, OTHER_STREAM, 10)  # another device: kept
    fake.drv.log.clear()
    _counters.release(0)
    frees = [x for x in fake.drv.log if x[0] == "free"]
    assert sorted(p for _, p, _ in frees) == sorted([a.ptr, b.ptr, c.ptr])
    assert {s for _, _, s in frees} == {LIBRARY_STREAM}, "a block was freed on the stream it served"
    assert fake.drv.log[-1] == ("sync", LIBRARY_STREAM)
    assert list(_counters._blocks.values()) == [d] and not _counters._retired


def test_a_full_table_starts_over_retiring_its_blocks(fake, monkeypatch):
    monkeypatch.setattr(_counters, "_MAX_STREAMS", 3)
    made = [_counters.counters(0, 0x100 * (i + 1), 10) for i in range(4)]
    assert list(_counters._blocks.values()) == [made[3]] and _counters._retired == made[:3]


def test_a_capturing_stream_gets_the_graphs_own_counters_each_call(fake):
    fake.capturing.add(CALL_STREAM)
    a = _counters.counters(0, CALL_STREAM, 10)
    b = _counters.counters(0, CALL_STREAM, 10)
    assert a is not b and not _counters._blocks, "the graph must not bake in the stream's eager counters"
    assert [x[0] for x in fake.drv.log] == ["memset", "memset"] and fake.drv.log[0][3] == 10


def test_a_recorded_call_gets_a_placeholder(fake):
    with _recording.Recorder(3, _recording.BASES[0]) as rec:
        p = _counters.counters(0, CALL_STREAM, 77)
    assert _recording.slot_of(p.ptr, rec.base) == (3, 0)
    assert rec.allocations == [((77,), _recording.COUNTERS, None)]
    assert not fake.allocs and not fake.drv.log
