/* Reading a call's operands as `call.Call` adapts them, and the per-call address checks. */
#include "warm.h"

int current_stream(Current *c, int kind, long dev) {
    if (c->handle != NULL && c->kind == kind && c->dev == dev) return 1;
    Py_CLEAR(c->handle);
    Py_CLEAR(c->owner);
    PyObject *devo = PyLong_FromLong(dev);
    if (devo == NULL) return -1;
    if (kind == K_TORCH) {
        PyObject *getter = PyObject_GetAttr(g_importer_mod, s_torch_stream);
        if (getter == NULL) { Py_DECREF(devo); return -1; }
        if (getter == Py_None) { Py_DECREF(getter); Py_DECREF(devo); return 0; }
        c->handle = PyObject_CallFunctionObjArgs(getter, devo, NULL);
        Py_DECREF(getter);
        Py_INCREF(Py_None);
        c->owner = Py_None;
    } else {
        c->owner = PyObject_CallFunctionObjArgs(g_cupy_stream, devo, NULL);
        c->handle = c->owner == NULL ? NULL : PyObject_GetAttr(c->owner, s_ptr);
    }
    Py_DECREF(devo);
    if (c->handle == NULL || !PyLong_Check(c->handle)) {
        Py_CLEAR(c->handle);
        Py_CLEAR(c->owner);
        soft_clear();
        return 0;
    }
    c->kind = kind;
    c->dev = dev;
    return 1;
}

/* A layout table's entry (shape tuple, byte strides, NumPy dtype) into `a`. 1 found, 0 miss. */
static int take_layout(Operand *a, PyObject *table, PyObject *key) {
    PyObject *f = PyDict_GetItemWithError(table, key);  /* borrowed */
    if (f == NULL || !PyTuple_Check(f) || PyTuple_Size(f) != 3) {
        PyErr_Clear();
        return 0;
    }
    a->shape = PyTuple_GetItem(f, 0);
    a->strides = PyTuple_GetItem(f, 1);
    a->dtype = PyTuple_GetItem(f, 2);
    Py_INCREF(a->shape);
    Py_INCREF(a->strides);
    Py_INCREF(a->dtype);
    Py_INCREF(Py_False);
    a->readonly = Py_False;
    return 1;
}

/* A DeviceArray of these fields (borrowed), as `object.__new__` and the slots' assignments make one
 * in Python (`_arrays.array.new_array`): a new reference, or NULL with an exception. */
PyObject *device_array(PyObject *ptr, PyObject *shape, PyObject *strides, PyObject *dtype, PyObject *device_id,
                              PyObject *readonly, PyObject *owner, PyObject *stream) {
    PyObject *a = PyObject_CallFunctionObjArgs(g_object_new, g_device_array, NULL);
    if (a != NULL && (set_field(a, F_PTR, ptr) || set_field(a, F_SHAPE, shape) || set_field(a, F_STRIDES, strides) ||
                      set_field(a, F_DTYPE, dtype) || set_field(a, F_DEVICE_ID, device_id) ||
                      set_field(a, F_READONLY, readonly) || set_field(a, F_OWNER, owner) ||
                      set_field(a, F_STREAM_HANDLE, stream)))
        Py_CLEAR(a);
    return a;
}

/* The importer's kind of `x`'s type (`importer.KINDS`, filled as types are first adapted), or -1. */
int kind_of(PyObject *x) {
    PyObject *kinds = PyObject_GetAttr(g_importer_mod, s_kinds);
    PyObject *k = kinds && PyDict_Check(kinds) ? PyDict_GetItemWithError(kinds, (PyObject *)Py_TYPE(x)) : NULL;
    long v = k ? PyLong_AsLong(k) : -1;
    Py_XDECREF(kinds);
    PyErr_Clear();
    return (int)v;
}

/* A torch tensor's or CuPy array's layout (dtype, shape, strides: torch's from its stride() method)
 * mapped through its package's table in `accessors` (filled by the Python path) into `a`. 1 read,
 * 0 miss. */
static int read_layout(PyObject *x, Operand *a, int strides_method, PyObject *table_name) {
    PyObject *dtype = PyObject_GetAttr(x, s_dtype);
    PyObject *shape = dtype ? PyObject_GetAttr(x, s_shape) : NULL;
    PyObject *st = !shape ? NULL : strides_method ? PyObject_CallMethodObjArgs(x, s_stride, NULL)
                                                  : PyObject_GetAttr(x, s_strides);
    PyObject *key = st ? PyTuple_Pack(3, dtype, shape, st) : NULL;
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(st);
    PyObject *table = key ? PyObject_GetAttr(g_accessors_mod, table_name) : NULL;
    int ok = table != NULL && PyDict_Check(table) && take_layout(a, table, key);
    Py_XDECREF(table);
    Py_XDECREF(key);
    if (!ok) soft_clear();
    return ok;
}

/* DeviceArray `x`'s fields into `a`. 1 read, 0 miss. */
static int read_device_array(PyObject *x, Operand *a) {
    PyObject *p = field(x, F_PTR);
    if (p == NULL) { soft_clear(); return 0; }
    int ok = as_u64(p, &a->ptr);
    Py_DECREF(p);
    if (!ok) return 0;
    PyObject *d = field(x, F_DEVICE_ID);
    if (d == NULL) { soft_clear(); return 0; }
    a->device_id = PyLong_AsLong(d);
    Py_DECREF(d);
    if (a->device_id == -1 && PyErr_Occurred()) { soft_clear(); return 0; }
    a->shape = field(x, F_SHAPE);
    a->strides = field(x, F_STRIDES);
    a->dtype = field(x, F_DTYPE);
    a->readonly = field(x, F_READONLY);
    a->stream = field(x, F_STREAM_HANDLE);
    if (!a->shape || !a->strides || !a->dtype || !a->readonly || !a->stream) { soft_clear(); return 0; }
    return 1;
}

/* What importing JAX array `x` found (`known_jax._seen`: ptr, shape, strides, dtype, device, readonly), a
 * new reference, or NULL (not imported before, or gone; no exception left but a BaseException). */
static PyObject *jax_facts(PyObject *x) {
    PyObject *id = PyLong_FromVoidPtr(x);  /* id(x) */
    PyObject *e = id ? PyDict_GetItemWithError(g_jax_seen, id) : NULL;
    Py_XDECREF(id);
    if (e == NULL || !PyTuple_Check(e) || PyTuple_Size(e) != 2) { soft_clear(); return NULL; }
    Py_INCREF(e);  /* a weak reference's callback may drop the entry meanwhile */
    PyObject *o = PyObject_CallNoArgs(PyTuple_GetItem(e, 0));  /* the weak reference: x, or None once gone */
    PyObject *f = PyTuple_GetItem(e, 1);
    int same = o == x && f != NULL && PyTuple_Check(f) && PyTuple_Size(f) == 6;
    Py_XDECREF(o);
    if (same) Py_INCREF(f);
    Py_DECREF(e);
    soft_clear();
    return same ? f : NULL;
}

/* `known_jax.recall` in C: a DeviceArray of a JAX array imported before, read on `consumer`, its owner
 * the array and a capsule exported for the stream. 1 done (`a` read), 0 for the Python recall to do
 * (not known here, or the export failed: it asks again and raises naming the operand), -1 a
 * BaseException pending. */
static int jax_recall(PyObject *x, long long consumer, Operand *a) {
    PyObject *f = jax_facts(x);
    if (f == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *kw = PyDict_New(), *sync = PyLong_FromLongLong(consumer == 0 ? 1 : consumer), *cap = NULL;
    if (kw && sync && PyDict_SetItem(kw, s_stream, sync) == 0) {  /* JAX orders its writes before the stream */
        /* `known_jax.export`: JAX's own export of the array's shard where `_export` names it for this type */
        PyObject *e = PyObject_GetAttr(g_known_jax_mod, s_export);
        if (e && PyTuple_Check(e) && PyTuple_Size(e) == 2 && PyTuple_GetItem(e, 1) == (PyObject *)Py_TYPE(x)) {
            PyObject *shard = PyObject_CallMethodObjArgs(x, s_fully_replicated_shard, NULL);
            PyObject *args = shard ? PyTuple_Pack(1, shard) : NULL;
            cap = args ? PyObject_Call(PyTuple_GetItem(e, 0), args, kw) : NULL;
            Py_XDECREF(shard);
            Py_XDECREF(args);
        }
        Py_XDECREF(e);
        if (cap == NULL) {  /* not served so, or refused: JAX's method (which says what is wrong) */
            soft_clear();
            PyObject *meth = PyErr_Occurred() ? NULL : PyObject_GetAttr(x, s_dlpack);
            cap = meth ? PyObject_Call(meth, g_empty, kw) : NULL;
            Py_XDECREF(meth);
        }
    }
    Py_XDECREF(kw);
    Py_XDECREF(sync);
    PyObject *owner = cap ? PyTuple_Pack(2, x, cap) : NULL, *c = owner ? PyLong_FromLongLong(consumer) : NULL;
    Py_XDECREF(cap);
    PyObject *w = c ? device_array(PyTuple_GetItem(f, 0), PyTuple_GetItem(f, 1), PyTuple_GetItem(f, 2),
                                   PyTuple_GetItem(f, 3), PyTuple_GetItem(f, 4), PyTuple_GetItem(f, 5), owner, c)
                    : NULL;
    Py_DECREF(f);
    Py_XDECREF(owner);
    Py_XDECREF(c);
    if (w == NULL) {
        soft_clear();
        return PyErr_Occurred() ? -1 : 0;
    }
    a->kind = K_JAX;
    a->adapted = w;
    if (read_device_array(w, a)) return 1;
    operand_clear(a);  /* the Python recall reads it again, and says what is wrong */
    return 0;
}

/* cudattn's stream on a known JAX array's device (`operands.consumer_stream`'s rule): 1 found, 0 for
 * the Python rule to say (no exception left but a BaseException). */
int jax_consumer(PyObject *x, PyObject **handle, PyObject **keep) {
    PyObject *f = jax_facts(x);
    PyObject *ref = f ? PyDict_GetItemWithError(g_default_refs, PyTuple_GetItem(f, 4)) : NULL;
    Py_XINCREF(ref);
    Py_XDECREF(f);
    *handle = ref ? PyObject_GetAttr(ref, s_handle) : NULL;
    *keep = *handle ? PyObject_GetAttr(ref, s_obj) : NULL;
    Py_XDECREF(ref);
    if (*keep == NULL) Py_CLEAR(*handle);
    soft_clear();
    return *handle != NULL;
}

/* Read operand `x` into `a` as `call.Call` adapts it, for a call on `consumer` (-1: not known yet;
 * JAX arrays need it). 1 read, 0 miss (not a kind served here, or a fact the Python path must
 * judge), -1 an error to raise (a JAX array that refused its export, as the Python path raises). */
int read_operand(PyObject *x, Operand *a, Current *cur, long long consumer, PyObject *name) {
    a->obj = x;
    if (x == Py_None) { a->kind = K_ABSENT; return 1; }
    PyObject *t = (PyObject *)Py_TYPE(x);
    if (t == g_device_array) {
        a->kind = K_CUDATTN;
        return read_device_array(x, a);
    }
    if (kind_of(x) == K_JAX) {  /* an array imported before: recalled, its capsule asked for with the stream */
        if (consumer < 0) return 0;
        int done = jax_recall(x, consumer, a);
        if (done != 0) return done;
        PyObject *c = PyLong_FromLongLong(consumer), *sync = PyLong_FromLongLong(consumer == 0 ? 1 : consumer);
        PyObject *r = c && sync ? PyObject_CallMethodObjArgs(g_known_jax_mod, s_recall, x, c, sync, name, NULL) : NULL;
        Py_XDECREF(c);
        Py_XDECREF(sync);
        if (r == NULL) return PyErr_ExceptionMatches(PyExc_ValueError) ? -1 : (soft_clear(), 0);
        if (r == Py_None || (PyObject *)Py_TYPE(r) != g_device_array) {
            Py_DECREF(r);
            return 0;  /* not imported before: the Python path imports it */
        }
        a->kind = K_JAX;
        a->adapted = r;
        return read_device_array(r, a);
    }
    /* torch: the accessors' plain tensor types, once torch has been seen */
    PyObject *plain = PyObject_GetAttr(g_accessors_mod, s_torch_plain);
    if (plain == NULL) return -1;
    int is_torch = PySet_Check(plain) ? PySet_Contains(plain, t) : 0;
    Py_DECREF(plain);
    if (is_torch < 0) { soft_clear(); return 0; }
    if (is_torch) {
        a->kind = K_TORCH;
        if (!read_layout(x, a, 1, s_torch_layouts)) return 0;
        int cuda = attr_true(x, s_is_cuda);
        if (cuda != 1) { soft_clear(); return 0; }
        PyObject *neg = PyObject_CallMethodObjArgs(x, s_is_neg, NULL);
        if (neg == NULL) { soft_clear(); return 0; }
        int negated = PyObject_IsTrue(neg);
        Py_DECREF(neg);
        if (negated != 0) { soft_clear(); return 0; }
        PyObject *p = PyObject_CallMethodObjArgs(x, s_data_ptr, NULL);
        if (p == NULL) { soft_clear(); return 0; }
        int okp = as_u64(p, &a->ptr);
        Py_DECREF(p);
        PyObject *d = okp ? PyObject_CallMethodObjArgs(x, s_get_device, NULL) : NULL;
        if (d == NULL) { soft_clear(); return 0; }
        a->device_id = PyLong_AsLong(d);
        Py_DECREF(d);
        if (a->device_id < 0) { soft_clear(); return 0; }
    } else {
        PyObject *types = PyObject_GetAttr(g_accessors_mod, s_cupy_types);
        if (types == NULL) return -1;
        int is_cupy = PyTuple_Check(types) && PyTuple_Size(types) == 1 && PyTuple_GetItem(types, 0) == t;
        Py_DECREF(types);
        if (!is_cupy) return 0;
        a->kind = K_CUPY;
        if (!read_layout(x, a, 0, s_cupy_layouts)) return 0;
        PyObject *mem = PyObject_GetAttr(x, s_data);
        PyObject *p = mem ? PyObject_GetAttr(mem, s_ptr) : NULL;
        PyObject *d = p ? PyObject_GetAttr(mem, s_device_id) : NULL;
        Py_XDECREF(mem);
        int okp = p != NULL && as_u64(p, &a->ptr);
        Py_XDECREF(p);
        if (!okp || d == NULL) { Py_XDECREF(d); soft_clear(); return 0; }
        a->device_id = PyLong_AsLong(d);
        Py_DECREF(d);
        if (a->device_id < 0) { soft_clear(); return 0; }
    }
    int found = current_stream(cur, a->kind, a->device_id);
    if (found <= 0) return found;
    Py_INCREF(cur->handle);
    a->stream = cur->handle;
    return 1;
}

/* The per-call address checks of `RecordedCall.plain`, on the recorded spans. 1 plain, 0 not, -1 error. */
static int span_of(PyObject *t, Py_ssize_t i, long long *v) {
    PyObject *o = PyTuple_GetItem(t, i);
    if (o == NULL) return -1;
    *v = PyLong_AsLongLong(o);
    return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int overlaps_any(PyObject *others, unsigned long long lo, unsigned long long hi, const unsigned long long *ptrs,
                        Py_ssize_t n) {
    Py_ssize_t m = PyTuple_Size(others);
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *e = PyTuple_GetItem(others, j);
        long long slot, a, b;
        if (e == NULL || span_of(e, 0, &slot) || span_of(e, 1, &a) || span_of(e, 2, &b)) return -1;
        if (slot < 0 || slot >= n) return -1;
        unsigned long long p = ptrs[slot];
        if (p + (unsigned long long)a < hi && lo < p + (unsigned long long)b) return 1;
    }
    return 0;
}

int plain(PyObject *rec, const unsigned long long *ptrs, Py_ssize_t n) {
    int r = -1;
    PyObject *nonempty = field(rec, F_NONEMPTY), *out_index = field(rec, F_OUT_INDEX),
             *out_span = field(rec, F_OUT_SPAN), *inputs = field(rec, F_INPUTS), *more = field(rec, F_MORE);
    if (!nonempty || !out_index || !out_span || !inputs || !more || !PyTuple_Check(nonempty) ||
        !PyTuple_Check(inputs) || !PyTuple_Check(more))
        goto done;
    for (Py_ssize_t j = 0; j < PyTuple_Size(nonempty); j++) {
        long long i;
        if (span_of(nonempty, j, &i) || i < 0 || i >= n) goto done;
        if (!ptrs[i] || (ptrs[i] & 15)) { r = 0; goto done; }
    }
    if (out_span != Py_None) {
        long long oi, a, b;
        if (!PyLong_Check(out_index) || !PyTuple_Check(out_span)) goto done;
        oi = PyLong_AsLongLong(out_index);
        if (oi < 0 || oi >= n || span_of(out_span, 0, &a) || span_of(out_span, 1, &b)) goto done;
        int o = overlaps_any(inputs, ptrs[oi] + (unsigned long long)a, ptrs[oi] + (unsigned long long)b, ptrs, n);
        if (o) { r = o < 0 ? -1 : 0; goto done; }
    }
    for (Py_ssize_t j = 0; j < PyTuple_Size(more); j++) {
        PyObject *e = PyTuple_GetItem(more, j);
        long long k, c, d;
        if (e == NULL || span_of(e, 0, &k) || span_of(e, 1, &c) || span_of(e, 2, &d) || k < 0 || k >= n) goto done;
        PyObject *others = PyTuple_GetItem(e, 3);
        if (others == NULL || !PyTuple_Check(others)) goto done;
        int o = overlaps_any(others, ptrs[k] + (unsigned long long)c, ptrs[k] + (unsigned long long)d, ptrs, n);
        if (o) { r = o < 0 ? -1 : 0; goto done; }
    }
    r = 1;
done:
    if (r < 0) PyErr_Clear();
    Py_XDECREF(nonempty);
    Py_XDECREF(out_index);
    Py_XDECREF(out_span);
    Py_XDECREF(inputs);
    Py_XDECREF(more);
    return r;
}

/* A DeviceArray for a foreign operand that the call returns (`out`), on `stream` (the call's, which its
 * contents are now written on): what the Python path returns. */
PyObject *wrap(const Operand *a, PyObject *stream) {
    PyObject *ptr = PyLong_FromUnsignedLongLong(a->ptr), *dev = PyLong_FromLong(a->device_id);
    PyObject *w = ptr && dev ? device_array(ptr, a->shape, a->strides, a->dtype, dev, a->readonly, a->obj, stream)
                             : NULL;
    Py_XDECREF(ptr);
    Py_XDECREF(dev);
    return w;
}
