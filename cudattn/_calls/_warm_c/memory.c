/* Memory a warm call finds kept, served without calling into Python: a result's block kept on the host
 * (`_arrays.alloc`) and a stream's counters or workspace (`_arrays.stream_memory`). `kept_block` and
 * `kept_stream_memory` do what the Python function's first branch does, under the same rules, or return
 * NULL with no exception where that branch would not serve (nothing kept, a stream that is not lasting,
 * a lock held elsewhere, or the module's function replaced by a test's stand-in); `take_block` and
 * `take_stream_memory` then call the Python function. */
#include "warm.h"

/* `alloc.allocate(dev, nbytes, stream, keep, reuse=True)` where a block of that size is kept for
 * `stream`: the last of `_kept[(dev, stream, nbytes)]`, taken under `_kept_lock` (never waited for,
 * as `Block.__del__` never waits: held elsewhere, the Python function serves), as a new `Block`. */
static PyObject *kept_block(PyObject *dev, PyObject *nbytes, PyObject *stream, PyObject *keep) {
    PyObject *lasting = module_global(g_alloc_mod, s_lasting_streams);  /* the set `allocate` reads */
    if (module_global(g_alloc_mod, s_allocate_block) != g_alloc_allocate || lasting == NULL ||
        PySet_Contains(lasting, stream) != 1) {
        soft_clear();
        return NULL;
    }
    PyObject *kept = module_global(g_alloc_mod, s_kept), *kept_bytes = module_global(g_alloc_mod, s_kept_bytes),
             *lock = module_global(g_alloc_mod, s_kept_lock);
    if (kept == NULL || kept_bytes == NULL || lock == NULL || !PyDict_Check(kept) || !PyDict_Check(kept_bytes))
        return NULL;
    PyObject *key = PyTuple_Pack(3, dev, stream, nbytes);
    if (key == NULL) return NULL;
    PyObject *seen = PyDict_GetItemWithError(kept, key);  /* borrowed: only asked whether anything is kept */
    if (seen == NULL || !PyList_Check(seen) || PyList_Size(seen) == 0) {
        Py_DECREF(key);
        soft_clear();
        return NULL;
    }
    Py_INCREF(kept);
    Py_INCREF(kept_bytes);
    Py_INCREF(lock);
    /* The Block first (its address 0 until it takes one: dropped unused, it frees nothing), so that
     * nothing can fail between taking a kept block and handing it over. Making it may run a collection,
     * and other threads with it: the list is looked up again under the lock, as `allocate` does
     * (`release_kept` may have taken it out of `_kept` and freed its blocks meanwhile). */
    PyObject *block = PyObject_CallFunctionObjArgs(g_object_new, g_block_class, NULL), *found = NULL;
    if (block != NULL && set_field(block, F_B_PTR, g_zero) == 0) {
        PyObject *got = PyObject_CallMethodObjArgs(lock, s_acquire, Py_False, NULL);
        int locked = got == Py_True;
        Py_XDECREF(got);
        if (locked) {
            PyObject *list = PyDict_GetItemWithError(kept, key);  /* borrowed; nothing below runs Python */
            Py_ssize_t n = list != NULL && PyList_Check(list) ? PyList_Size(list) : 0;
            PyObject *last = n > 0 ? PyList_GetItem(list, n - 1) : NULL;
            if (last != NULL && PyTuple_Check(last) && PyTuple_Size(last) == 2) {
                Py_INCREF(last);
                if (PyList_SetSlice(list, n - 1, n, NULL) == 0) found = last;
                else Py_DECREF(last);
            }
            if (found != NULL) {  /* `_kept_bytes[dev] -= nbytes` (a bound on what is kept, not on correctness) */
                PyObject *had = PyDict_GetItemWithError(kept_bytes, dev);
                PyObject *now = had ? PyNumber_Subtract(had, nbytes) : NULL;
                if (now != NULL) PyDict_SetItem(kept_bytes, dev, now);
                Py_XDECREF(now);
            }
            Py_XDECREF(PyObject_CallMethodObjArgs(lock, s_release, NULL));
        }
    }
    Py_DECREF(key);
    Py_DECREF(kept);
    Py_DECREF(kept_bytes);
    Py_DECREF(lock);
    soft_clear();
    if (found == NULL) {  /* nothing taken: the Python function serves (or an interrupt is raised) */
        Py_XDECREF(block);
        return NULL;
    }
    /* as `allocate` makes it (device_id set: kept again when dropped); member slots take any object */
    set_field(block, F_B_NBYTES, nbytes);
    set_field(block, F_B_STREAM, stream);
    set_field(block, F_B_KEEP, keep);
    set_field(block, F_B_CTX, PyTuple_GetItem(found, 1));
    set_field(block, F_B_DEVICE_ID, dev);
    set_field(block, F_B_PTR, PyTuple_GetItem(found, 0));
    Py_DECREF(found);
    if (PyErr_Occurred()) Py_CLEAR(block);  /* an interrupt meanwhile: raised; the block, dropped, is kept again */
    return block;
}

/* `stream_memory.counters(dev, stream, count, keep, capturing=False, optional)` (`kind` 0, `size` the
 * count) or `.workspace(dev, stream, nbytes, keep, capturing=False)` (`kind` 1, `size` the bytes) where
 * the stream's block of that kind is in the table and large enough: that block. */
static PyObject *kept_stream_memory(int kind, PyObject *dev, PyObject *stream, PyObject *size, PyObject *keep) {
    PyObject *fn = module_global(g_stream_memory_mod, kind ? s_workspace : s_counters);
    if (fn != (kind ? g_sm_workspace : g_sm_counters)) return NULL;
    unsigned long long h = 0, want = 0;
    if (!as_u64(stream, &h) || h == 2 || !as_u64(size, &want)) return NULL;  /* per-thread stream: its own */
    {  /* `_key`: a bare handle, or one torch only wraps, of a stream that is not lasting is keyed by the
        * stream's id too (a driver query): the Python function's */
        PyObject *mod = module_global(g_stream_memory_mod, s_stream_module);
        if (mod == NULL) return NULL;
        int by_id = 1;  /* the sets are read only where they decide (the usual call: an owner, not external) */
        if (keep != Py_None) {
            PyObject *external = PyObject_GetAttr(mod, s_torch_external);
            by_id = external ? PySet_Contains(external, stream) : -1;
            Py_XDECREF(external);
        }
        if (by_id == 1) {
            PyObject *lasting = PyObject_GetAttr(mod, s_lasting_streams);
            by_id = lasting ? (PySet_Contains(lasting, stream) == 1 ? 0 : 1) : -1;
            Py_XDECREF(lasting);
        }
        soft_clear();
        if (by_id != 0) return NULL;
    }
    if (kind) {  /* larger than kept workspaces get: the call's own */
        PyObject *cap = module_global(g_stream_memory_mod, s_workspace_kept_max);
        unsigned long long c = 0;
        if (cap == NULL || !as_u64(cap, &c) || want > c) return NULL;
    } else {
        want *= 4;  /* int32 counters */
    }
    PyObject *blocks = module_global(g_stream_memory_mod, s_blocks);
    PyObject *k = kind ? PyLong_FromLong(1) : PyLong_FromLong(0);
    PyObject *key = k ? PyTuple_Pack(3, dev, stream, k) : NULL;
    Py_XDECREF(k);
    PyObject *entry = key && blocks && PyDict_Check(blocks) ? PyDict_GetItemWithError(blocks, key) : NULL;
    Py_XDECREF(key);
    if (entry == NULL) {
        soft_clear();
        return NULL;
    }
    Py_INCREF(entry);
    PyObject *nb = PyObject_GetAttr(entry, s_nbytes);
    unsigned long long have = 0;
    int ok = nb != NULL && as_u64(nb, &have) && have >= want;
    Py_XDECREF(nb);
    if (ok) {  /* made for another object naming a stream that does not last: the Python function asks
                * the driver whether it is the same stream still (`_lookup`) */
        PyObject *sid = PyObject_GetAttr(entry, s_sid);
        PyObject *owner = sid != NULL && sid != Py_None ? PyObject_GetAttr(entry, s_keep) : NULL;
        ok = sid == Py_None || (owner != NULL && owner == keep);
        Py_XDECREF(sid);
        Py_XDECREF(owner);
    }
    soft_clear();
    if (!ok) Py_CLEAR(entry);  /* outgrown: the Python function grows it */
    return entry;
}

/* A block of `nbytes` for `stream`, as `alloc.allocate(dev, nbytes, stream, keep, reuse=True)` gives it:
 * a kept one taken here, else the Python function's. NULL with an exception. */
PyObject *take_block(PyObject *dev, PyObject *nbytes, PyObject *stream, PyObject *keep) {
    PyObject *block = kept_block(dev, nbytes, stream, keep);
    if (block == NULL && !PyErr_Occurred())
        block = PyObject_CallMethodObjArgs(g_alloc_mod, s_allocate_block, dev, nbytes, stream, keep, Py_True, NULL);
    return block;
}

/* The stream's counters (`kind` 0: `size` of them, `optional` as `counters` takes it) or workspace
 * (`kind` 1: `size` bytes) on a stream known not to capture: the kept block taken here, else the
 * Python function's. NULL with an exception. */
PyObject *take_stream_memory(int kind, PyObject *dev, PyObject *stream, PyObject *size, PyObject *keep,
                             PyObject *optional) {
    PyObject *got = kept_stream_memory(kind, dev, stream, size, keep);
    if (got != NULL || PyErr_Occurred()) return got;
    return kind ? PyObject_CallMethodObjArgs(g_stream_memory_mod, s_workspace, dev, stream, size, keep, Py_False, NULL)
                : PyObject_CallMethodObjArgs(g_stream_memory_mod, s_counters, dev, stream, size, keep, Py_False,
                                             optional, NULL);
}
