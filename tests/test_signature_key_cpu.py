"""CPU: the operand part of a call's signature key, as the compiled extension writes it for both call
paths (`_warm_c/signature.c`): equal signatures key alike, every fact that changes a call keys apart,
and what cannot be keyed is refused with a TypeError (the call path then runs the full path)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cudattn._arrays.array import DeviceArray
from cudattn._calls import call as _call
from cudattn._calls import warm as _warm

pytestmark = pytest.mark.skipif(_warm.signature is None, reason="built without the compiled warm path")
sign = _warm.signature
F16 = np.dtype(np.float16)
SHAPE, STRIDES = (2, 64, 4, 64), (32768, 512, 128, 2)
FLAGS = (False, None, "bshd", False, None, None)


def _op(t=DeviceArray, shape=SHAPE, strides=STRIDES, dtype=F16, dev=0, ro=False):
    return (t, shape, strides, dtype, dev, ro)


def test_equal_signatures_key_alike_whatever_objects_carry_them():
    base = sign((_op(), _op(), None, _op()), FLAGS)
    # equal values in other objects: a dtype equal but not the same object, tuples rebuilt, ints of numpy
    other = np.dtype(np.float16).newbyteorder("=")
    assert other is not F16 and other == F16
    again = sign((_op(dtype=other), _op(shape=tuple(list(SHAPE))), None,
                  _op(strides=tuple(np.int64(s) for s in STRIDES), ro=0)), (False, None, "bs" + "hd", False, None, None))
    assert again == base
    assert isinstance(base, bytes)


@pytest.mark.parametrize("change", [
    lambda: (_op(t=np.ndarray), _op(), None, _op()),                      # an operand's type
    lambda: (_op(shape=(2, 64, 4, 65)), _op(), None, _op()),              # an extent
    lambda: (_op(shape=(2, 64, 256)), _op(), None, _op()),                # a dimension count
    lambda: (_op(strides=(32768, 512, 128, 4)), _op(), None, _op()),      # a stride
    lambda: (_op(dtype=np.dtype(ml_dtypes.bfloat16)), _op(), None, _op()),  # a dtype of the same size
    lambda: (_op(dev=1), _op(), None, _op()),                             # the device
    lambda: (_op(ro=True), _op(), None, _op()),                           # read-only
    lambda: (_op(), _op(), _op(), _op()),                                 # an absent operand given
    lambda: (_op(), None, _op(), _op()),                                  # absent in another place
    lambda: (_op(), _op(), None),                                         # one operand fewer
])
def test_every_fact_of_the_operands_keys_apart(change):
    assert sign(change(), FLAGS) != sign((_op(), _op(), None, _op()), FLAGS)


def test_flags_equal_in_value_but_not_in_type_key_apart():
    ops = (_op(),)
    keys = {sign(ops, (True,)), sign(ops, (1,)), sign(ops, (1.0,)), sign(ops, (np.float32(1),))}
    assert len(keys) == 4
    assert sign(ops, (True,)) == sign(ops, (bool(1),))


def test_shapes_and_strides_are_not_confused_across_their_boundary():
    # the same integers, split between shape and strides differently
    a = sign((_op(shape=(2, 3), strides=(4, 5, 6)),), ())
    b = sign((_op(shape=(2, 3, 4), strides=(5, 6)),), ())
    assert a != b


@pytest.mark.parametrize("bad, message", [
    ((_op(shape=tuple([1] * 17), strides=tuple([1] * 17)),), "more dimensions than 16"),
    ((_op(shape=[2, 64, 4, 64]),), "no tuple"),
    ((_op(shape=(2, 64, 4.0, 64)),), "integer"),
    ((("not a 6-tuple",),), "not \\(type, shape"),
])
def test_what_cannot_be_keyed_raises_a_type_error(bad, message):
    with pytest.raises(TypeError, match=message):
        sign(bad, FLAGS)


def test_an_unhashable_dtype_raises_a_type_error():
    with pytest.raises(TypeError):
        sign((_op(dtype=[F16]),), FLAGS)


def test_the_call_path_keys_plans_by_those_bytes_and_a_plan_holds_the_objects_they_name(monkeypatch):
    keys = []

    class Table(dict):
        def get(self, key, default=None):
            keys.append(key)
            raise TypeError("stop here")  # the key is all this test needs

    monkeypatch.setattr(_call, "_plans", Table())
    c = _call.Call.__new__(_call.Call)
    c.objs = c.ops = c.names = ()
    c.op, c.sig, c.consumer, c.keep = "attention", (_op(),), 0, None
    try:
        c.run(FLAGS, None, lambda *a: None, (), tensors=0, out_index=None, allocates=False)
    except Exception:  # noqa: BLE001 (the stub call stops after the lookup)
        pass
    assert keys and keys[0][:3] == ("attention", sign((_op(),), FLAGS), FLAGS)
    rec = _call.RecordedCall(None, [], 0, None, (), (_op(),))
    assert rec.sig == (_op(),)


def test_any_count_of_operands_is_keyed():
    # a merge of many separate parts has more operands than the compiled path takes (it keeps to the
    # Python path), whose key must still be made
    many = tuple(_op(shape=(1, 8, 4, i + 1)) for i in range(400))
    key = sign(many, FLAGS)
    assert key == sign(tuple(many), FLAGS) and key != sign(many[:-1], FLAGS)
    assert sign((None,) * 100, ()) != sign((None,) * 99, ())
