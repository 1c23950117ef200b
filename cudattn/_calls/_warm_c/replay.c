/* A recorded call replayed: its memory, its argument blocks, its launches. */
#include "warm.h"

/* A call's allocations on a stream known not to capture (`Replay.native`), made as `Replay._allocate`
 * makes them there: results on blocks of `_arrays.alloc.allocate` (reuse allowed), counters and a kept
 * workspace from `_arrays.stream_memory`, a workspace of the call's own from `allocate` (each taken in C
 * where it was kept: memory.c); their addresses
 * appended to `ptrs`. Returns what `_allocate` returns (per slot its array or counters, None for a
 * workspace slice; then the workspace block or None), or NULL with an exception. */
static PyObject *allocate_native(PyObject *native, long device_id, PyObject *stream, PyObject *keep, PyObject *ptrs) {
    if (!PyTuple_Check(native) || PyTuple_Size(native) != 3 || !PyTuple_Check(PyTuple_GetItem(native, 2))) {
        PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded allocation of an unexpected form");
        return NULL;
    }
    PyObject *scratch_bytes = PyTuple_GetItem(native, 0), *items = PyTuple_GetItem(native, 2);
    PyObject *dev = PyLong_FromLong(device_id), *made = dev ? PyList_New(0) : NULL, *scratch = NULL;
    unsigned long long base = 0;
    keep = keep ? keep : Py_None;
    int has_scratch = made ? PyObject_IsTrue(scratch_bytes) : -1;
    if (has_scratch < 0) goto fail;
    if (has_scratch) {  /* one kernel: the stream's kept workspace; more: the call's own (`_allocate`) */
        scratch = PyTuple_GetItem(native, 1) == Py_True
            ? take_stream_memory(1, dev, stream, scratch_bytes, keep, NULL)
            : take_block(dev, scratch_bytes, stream, keep);
        PyObject *p = scratch ? PyObject_GetAttr(scratch, s_ptr) : NULL;
        int ok = p != NULL && as_u64(p, &base);
        Py_XDECREF(p);
        if (!ok) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: a workspace without an address");
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(items); i++) {
        PyObject *it = PyTuple_GetItem(items, i), *held = NULL, *ptr = NULL;
        if (PyLong_Check(it)) {  /* a slice of the workspace */
            unsigned long long off = PyLong_AsUnsignedLongLong(it);
            if (!(off == (unsigned long long)-1 && PyErr_Occurred())) {
                ptr = PyLong_FromUnsignedLongLong(base + off);
                held = Py_None;
                Py_INCREF(held);
            }
        } else if (PyTuple_Check(it) && PyTuple_Size(it) == 2) {  /* the stream's counters: (count, optional) */
            held = take_stream_memory(0, dev, stream, PyTuple_GetItem(it, 0), keep, PyTuple_GetItem(it, 1));
            ptr = held ? PyObject_GetAttr(held, s_ptr) : NULL;
        } else if (PyTuple_Check(it) && PyTuple_Size(it) == 4) {  /* a result: (shape, dtype, strides, bytes) */
            PyObject *block = take_block(dev, PyTuple_GetItem(it, 3), stream, keep);
            ptr = block ? PyObject_GetAttr(block, s_ptr) : NULL;
            held = ptr ? device_array(ptr, PyTuple_GetItem(it, 0), PyTuple_GetItem(it, 2), PyTuple_GetItem(it, 1), dev,
                                      Py_False, block, stream) : NULL;
            Py_XDECREF(block);
        } else {
            PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded allocation of an unexpected form");
        }
        int bad = held == NULL || ptr == NULL || PyList_Append(ptrs, ptr) || PyList_Append(made, held);
        Py_XDECREF(held);
        Py_XDECREF(ptr);
        if (bad) goto fail;
    }
    if (PyList_Append(made, scratch ? scratch : Py_None)) goto fail;  /* held until the launches are queued */
    Py_XDECREF(scratch);
    Py_DECREF(dev);
    return made;
fail:
    Py_XDECREF(scratch);
    Py_XDECREF(made);
    Py_XDECREF(dev);
    return NULL;
}

#define MAP_BYTES 128   /* a CUtensorMap (`_kernels.tma.TENSOR_MAP_BYTES`) */
#define BUILT_MAX 64    /* `replay._BUILT_MAX` */

/* `_Step.build` for the operands at `ptrs`, where every tensor map's address was re-addressed before
 * (the maps' `seen` caches): the argument block in one bytes object (the kernel-argument array, one
 * pointer to the params, then the params: the template with the addresses written in), published in
 * `built` under `key` as the Python entry is: (argv address, then what holds it; only the address is
 * read, by either path, and the holders keep the memory while the entry is held). A new reference, or
 * NULL with no exception where a map has not been seen (`_Step.build` asks the driver), or with one. */
static PyObject *build_entry(PyObject *st, PyObject *ptrs, PyObject *key, PyObject *built) {
    PyObject *tpl = field(st, F_TEMPLATE), *pointers = field(st, F_POINTERS), *maps = field(st, F_MAPS);
    PyObject *buf = NULL, *entry = NULL, *addr = NULL;
    if (tpl == NULL || pointers == NULL || maps == NULL) goto done;
    if (!PyBytes_Check(tpl) || !PyTuple_Check(pointers) || !PyTuple_Check(maps)) goto bad;
    Py_ssize_t n = PyBytes_Size(tpl);
    if ((buf = PyBytes_FromStringAndSize(NULL, 8 + 63 + n)) == NULL) goto done;
    /* the params 64-byte aligned, as a CUtensorMap in them is declared (the driver copies them) */
    char *d = PyBytes_AsString(buf), *params = (char *)(((uintptr_t)d + 8 + 63) & ~(uintptr_t)63);
    memset(d, 0, (size_t)(8 + 63 + n));
    memcpy(params, PyBytes_AsString(tpl), (size_t)n);
    for (Py_ssize_t i = 0; i < PyTuple_Size(pointers) + PyTuple_Size(maps); i++) {
        int is_map = i >= PyTuple_Size(pointers);
        PyObject *e = is_map ? PyTuple_GetItem(maps, i - PyTuple_Size(pointers)) : PyTuple_GetItem(pointers, i);
        if (!PyTuple_Check(e) || PyTuple_Size(e) < (is_map ? 5 : 3)) goto bad;
        long long off = PyLong_AsLongLong(PyTuple_GetItem(e, 0)), delta = 0;
        Py_ssize_t slot = -1;
        if (PyErr_Occurred() || ((delta = PyLong_AsLongLong(PyTuple_GetItem(e, 2))) == -1 && PyErr_Occurred()) ||
            ((slot = PyLong_AsSsize_t(PyTuple_GetItem(e, 1))) == -1 && PyErr_Occurred()))
            goto done;
        unsigned long long base = 0;
        if (off < 0 || off + (is_map ? MAP_BYTES : 8) > n || slot < 0 || slot >= PyList_Size(ptrs) ||
            !as_u64(PyList_GetItem(ptrs, slot), &base)) goto bad;
        unsigned long long v = base + (unsigned long long)delta;
        if (!is_map) {
            memcpy(params + off, &v, 8);
            continue;
        }
        PyObject *seen = PyTuple_GetItem(e, 4);
        addr = PyLong_FromUnsignedLongLong(v);
        PyObject *m = addr && PyDict_Check(seen) ? PyDict_GetItemWithError(seen, addr) : NULL;  /* borrowed */
        Py_CLEAR(addr);
        if (m == NULL) goto done;  /* not seen (no exception): the Python build asks the driver */
        if (!PyBytes_Check(m) || PyBytes_Size(m) != MAP_BYTES) goto bad;
        memcpy(params + off, PyBytes_AsString(m), MAP_BYTES);
    }
    {
        unsigned long long pa = (unsigned long long)(uintptr_t)params;
        memcpy(d, &pa, 8);
        PyObject *argv = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)d);
        entry = argv ? PyTuple_Pack(3, argv, buf, buf) : NULL;
        Py_XDECREF(argv);
        if (entry == NULL) goto done;
        if (PyDict_Size(built) >= BUILT_MAX) PyDict_Clear(built);  /* many combinations: start over, bounded */
        if (PyDict_SetItem(built, key, entry) < 0) Py_CLEAR(entry);  /* whole before it is published */
    }
    goto done;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded launch of an unexpected form");
done:
    Py_XDECREF(buf);
    Py_XDECREF(tpl);
    Py_XDECREF(pointers);
    Py_XDECREF(maps);
    return entry;
}

/* Launch the recorded steps; returns the result or NULL with an exception. A call with allocations comes
 * here only on a stream found not capturing (`run`): its memory is made here (`Replay.native`), or by the
 * Python replay told so where no native form was recorded (an empty result). */
PyObject *replay(PyObject *rep, Operand *ops, Py_ssize_t n, PyObject *ptrs, long device_id,
                 unsigned long long consumer, PyObject *consumer_o, PyObject *keep) {
    PyObject *made = NULL, *result = NULL, *steps = NULL, *results = NULL, *allocations = NULL;
    allocations = field(rep, F_ALLOCATIONS);
    if (allocations == NULL) goto done;
    if (PyObject_IsTrue(allocations)) {
        PyObject *native = field(rep, F_NATIVE);
        if (native == NULL) goto done;
        if (native != Py_None) {
            made = allocate_native(native, device_id, consumer_o, keep, ptrs);
        } else {
            PyObject *dev = PyLong_FromLong(device_id);
            made = dev ? PyObject_CallMethodObjArgs(rep, s_allocate, ptrs, dev, consumer_o, keep, Py_False, NULL)
                       : NULL;
            Py_XDECREF(dev);
        }
        Py_DECREF(native);
        if (made == NULL) goto done;
    }
    steps = field(rep, F_STEPS);
    if (steps == NULL || !PyList_Check(steps)) goto bad;
    for (Py_ssize_t s = 0; s < PyList_Size(steps); s++) {
        PyObject *st = PyList_GetItem(steps, s);
        PyObject *built = field(st, F_BUILT), *slots = field(st, F_SLOTS);
        PyObject *key = slots ? PyObject_CallFunctionObjArgs(slots, ptrs, NULL) : NULL;
        /* the entry (argv address, argv, params buffer) is held until the launch is queued: another
         * thread may drop it from `built` while this one waits for the driver without the GIL */
        PyObject *entry = key && built ? PyDict_GetItemWithError(built, key) : NULL;
        Py_XINCREF(entry);
        if (entry == NULL && !PyErr_Occurred() && key != NULL && built != NULL && PyDict_Check(built))
            entry = build_entry(st, ptrs, key, built);
        if (entry == NULL && !PyErr_Occurred() && key != NULL) {
            PyObject *dev = PyLong_FromLong(device_id);
            entry = dev ? PyObject_CallMethodObjArgs(st, s_build, ptrs, dev, NULL) : NULL;
            Py_XDECREF(dev);
        }
        unsigned long long argv = 0;
        int ok = entry != NULL && PyTuple_Check(entry) && PyTuple_Size(entry) == 3 &&
                 as_u64(PyTuple_GetItem(entry, 0), &argv);
        Py_XDECREF(built);
        Py_XDECREF(slots);
        Py_XDECREF(key);
        if (!ok) {
            Py_XDECREF(entry);
            goto bad;
        }
        PyObject *la = field(st, F_LAUNCH_ARGS);
        unsigned long long v[8];
        int okl = la != NULL && PyTuple_Check(la) && PyTuple_Size(la) == 8;
        for (int i = 0; okl && i < 8; i++) okl = as_u64(PyTuple_GetItem(la, i), &v[i]);
        Py_XDECREF(la);
        if (!okl) {
            Py_DECREF(entry);
            goto bad;
        }
        if (g_armed) {
            if (!g_first_ns) {
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                g_first_ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
            }
            g_launches++;
        }
        int err;
        launch_fn launch = g_launch;  /* read with the GIL held (set_driver may change it) */
        if (launch == NULL) {
            Py_DECREF(entry);
            PyErr_SetString(PyExc_RuntimeError, "cudattn: no cuLaunchKernel entry point (set_driver(0, 0) meanwhile)");
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS
        err = launch((void *)(uintptr_t)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                       (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (void *)(uintptr_t)consumer,
                       (void **)(uintptr_t)argv, NULL);
        Py_END_ALLOW_THREADS
        Py_DECREF(entry);  /* the driver copied the params */
        if (err) {
            PyObject *e = PyLong_FromLong(err);
            PyObject *r = e ? PyObject_CallFunctionObjArgs(g_launch_failed, e, st, NULL) : NULL;
            Py_XDECREF(e);
            Py_XDECREF(r);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cuLaunchKernel failed");
            goto done;
        }
    }
    results = field(rep, F_RESULTS);
    PyObject *pair_o = field(rep, F_PAIR);
    int pair = pair_o == NULL ? -1 : PyObject_IsTrue(pair_o);
    Py_XDECREF(pair_o);
    if (results == NULL || !PyList_Check(results) || pair < 0) goto bad;
    Py_ssize_t nr = PyList_Size(results);
    PyObject *outs = PyTuple_New(nr);
    if (outs == NULL) goto done;
    for (Py_ssize_t i = 0; i < nr; i++) {
        long long slot = PyLong_AsLongLong(PyList_GetItem(results, i));
        PyObject *r = NULL;
        if (slot >= 0 && slot < n) {
            if (ops[slot].kind == K_CUDATTN || ops[slot].kind == K_JAX) {  /* the array, or JAX's adapted one */
                r = ops[slot].kind == K_JAX ? ops[slot].adapted : ops[slot].obj;
                Py_INCREF(r);
            } else if (ops[slot].kind != K_ABSENT) {
                r = wrap(&ops[slot], consumer_o);
            }
        } else if (slot >= n && made != NULL && PyList_Check(made) && slot - n < PyList_Size(made)) {
            r = PyList_GetItem(made, slot - n);
            Py_XINCREF(r);
        }
        if (r == NULL) {
            Py_DECREF(outs);
            goto bad;
        }
        PyTuple_SetItem(outs, i, r);
    }
    if (pair) {
        result = outs;
    } else {
        result = PyTuple_GetItem(outs, 0);
        Py_XINCREF(result);
        Py_DECREF(outs);
    }
    goto done;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: a recorded call of an unexpected form");
done:
    Py_XDECREF(made);
    Py_XDECREF(steps);
    Py_XDECREF(results);
    Py_XDECREF(allocations);
    return result;
}
