/* The warm call: `run`, what `call.Call` and the warm branch of `Call.run` do, or MISS. */
#include "warm.h"

#define MISS() do { miss_line = __LINE__; goto out_miss; } while (0)

/* MISS, or NULL where a BaseException that is no ordinary error (a KeyboardInterrupt) is pending. */
static PyObject *miss(void) {
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
        PyErr_Clear();
    }
    Py_INCREF(g_miss);
    return g_miss;
}

/* run(op, objs, names, stream, flags, key, out_index, more_outs, allocates) -> result or MISS */
PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9 || !g_configured) {
        PyErr_SetString(PyExc_TypeError, "run() takes 9 arguments, after configure()");
        return NULL;
    }
    PyObject *op = args[0], *objs = args[1], *names = args[2], *stream = args[3], *flags = args[4], *ekey = args[5],
             *out_index_o = args[6], *more_outs = args[7];
    int allocates = PyObject_IsTrue(args[8]);
    int is_list = PyList_Check(objs);
    if (!(is_list || PyTuple_Check(objs)) || !PyTuple_Check(names) || !PyTuple_Check(flags) ||
        !PyTuple_Check(more_outs) || allocates < 0)
        return miss();
    Py_ssize_t n = is_list ? PyList_Size(objs) : PyTuple_Size(objs);
    if (n < 1 || n > MAX_OPERANDS || PyTuple_Size(names) < n) return miss();

    Operand ops[MAX_OPERANDS];
    memset(ops, 0, sizeof ops);
    Current cur;
    memset(&cur, 0, sizeof cur);
    PyObject *keep = NULL, *consumer_o = NULL, *key = NULL, *sig = NULL, *rec = NULL, *rep = NULL, *ptrs = NULL,
             *result = NULL;
    Sig sg;
    unsigned char sig_buf[SIG_BYTES(MAX_OPERANDS)];
    unsigned long long consumer = 0;
    int st, miss_line = 0, torch_obj = 0;

    /* The consumer stream (`operands.consumer_stream`) */
    PyObject *first = is_list ? PyList_GetItem(objs, 0) : PyTuple_GetItem(objs, 0);
    int jax_first = stream == Py_None && (PyObject *)Py_TYPE(first) != g_device_array && kind_of(first) == K_JAX;
    if (jax_first && jax_consumer(first, &consumer_o, &keep)) {  /* cudattn's stream on the array's device */
    } else if (jax_first) {  /* not known here: the Python rule, asked of it */
        if (PyErr_Occurred()) MISS();
        PyObject *r = PyObject_CallMethodObjArgs(g_operands_mod, s_consumer_stream, first, Py_None, NULL);
        if (r == NULL || !PyTuple_Check(r) || PyTuple_Size(r) != 3) {
            Py_XDECREF(r);
            MISS();
        }
        consumer_o = PyTuple_GetItem(r, 0);
        keep = PyTuple_GetItem(r, 1);
        Py_INCREF(consumer_o);
        Py_INCREF(keep);
        Py_DECREF(r);
    } else if (stream == Py_None) {
        st = read_operand(first, &ops[0], &cur, -1, NULL);
        if (st <= 0 || ops[0].kind == K_ABSENT) MISS();
        if (ops[0].kind == K_CUDATTN) {
            if (ops[0].stream == Py_None) MISS();  /* cudattn's default stream: the Python path */
            PyObject *owner = field(first, F_OWNER);
            if (owner == NULL) MISS();
            keep = owner == Py_None ? NULL : PyObject_GetAttr(owner, s_keep);
            Py_DECREF(owner);
            if (keep == NULL) {  /* getattr(owner, "keep", None) */
                soft_clear();
                if (PyErr_Occurred()) MISS();
                Py_INCREF(Py_None);
                keep = Py_None;
            }
        } else {
            Py_INCREF(cur.owner);
            keep = cur.owner;
        }
        Py_INCREF(ops[0].stream);
        consumer_o = ops[0].stream;
    } else if (PyLong_CheckExact(stream)) {
        Py_INCREF(stream);
        consumer_o = stream;
        Py_INCREF(Py_None);
        keep = Py_None;
    } else {
        int attr = PySet_Contains(g_handle_attr_types, (PyObject *)Py_TYPE(stream));
        if (attr < 0) MISS();
        torch_obj = attr;
        if (attr) {  /* torch's streams: `cuda_stream` is the handle `as_stream` would find */
            consumer_o = PyObject_GetAttr(stream, s_cuda_stream);
            if (consumer_o == NULL || !PyLong_CheckExact(consumer_o)) MISS();
            Py_INCREF(stream);
            keep = stream;
        } else {
            PyObject *ref = PyObject_CallFunctionObjArgs(g_as_stream, stream, Py_None, NULL);
            if (ref == NULL) MISS();
            consumer_o = PyObject_GetAttr(ref, s_handle);
            keep = PyObject_GetAttr(ref, s_obj);
            Py_DECREF(ref);
            if (consumer_o == NULL || keep == NULL) MISS();
        }
    }
    if (!as_u64(consumer_o, &consumer) || consumer > (unsigned long long)LLONG_MAX) MISS();
    if (consumer > 2 && (stream == Py_None ? !jax_first && ops[0].kind == K_TORCH : torch_obj)) {
        /* a stream torch made lasts, one it only wraps is external (`stream.note_torch_stream`, asked once
         * a handle, and for each call of a stream object whose handle neither set holds yet) */
        PyObject *lasting = PyObject_GetAttr(g_stream_mod, s_lasting_streams);
        int known = lasting ? PySet_Contains(lasting, consumer_o) : -1;
        Py_XDECREF(lasting);
        if (known == 0) {  /* the external set read only where the lasting one does not hold it */
            PyObject *external = PyObject_GetAttr(g_stream_mod, s_torch_external);
            known = external ? PySet_Contains(external, consumer_o) : -1;
            Py_XDECREF(external);
        }
        if (known < 0) MISS();
        if (!known) {
            PyObject *dev = stream == Py_None ? PyLong_FromLong(ops[0].device_id) : Py_NewRef(Py_None);
            PyObject *r = dev ? PyObject_CallFunctionObjArgs(g_note_torch, stream, consumer_o, dev, NULL) : NULL;
            Py_XDECREF(dev);
            if (r == NULL) MISS();
            Py_DECREF(r);
        }
    }
    if (stream != Py_None || jax_first) {
        st = read_operand(first, &ops[0], &cur, (long long)consumer, PyTuple_GetItem(names, 0));
        if (st < 0) goto out_error;
        if (st == 0 || ops[0].kind == K_ABSENT) MISS();
    }

    /* The operands, their part of the signature (signature.c); those made on another stream are waited
     * for before the launch and held after it (`operands.order_and_hold`) */
    int foreign = 0;
    sig_start(&sg, sig_buf, (Py_ssize_t)sizeof sig_buf);
    for (Py_ssize_t i = 0; i < n; i++) {
        Operand *a = &ops[i];
        if (i > 0) {
            st = read_operand(is_list ? PyList_GetItem(objs, i) : PyTuple_GetItem(objs, i), a, &cur,
                              (long long)consumer, PyTuple_GetItem(names, i));
            if (st < 0) goto out_error;
            if (st == 0) MISS();
        }
        if (a->kind == K_ABSENT) {
            if (sig_absent(&sg) < 0) MISS();
            continue;
        }
        if (a->stream != Py_None) {
            unsigned long long h;
            if (!as_u64(a->stream, &h)) MISS();
            a->foreign = h != consumer;
            foreign |= a->foreign;
        }
        if (sig_operand(&sg, (PyObject *)Py_TYPE(a->obj), a->shape, a->strides, a->dtype, a->device_id,
                        a->readonly) < 0)
            MISS();  /* not keyable: the Python path finds it so too */
    }

    /* The key, as `Call.run` builds it */
    {
        if (sig_flag_types(&sg, flags) < 0 || (sig = sig_bytes(&sg)) == NULL) MISS();
        PyObject *forced = global_of(g_traits_mod, s_forced);
        PyObject *margin = forced ? PyObject_GetAttr(g_margin_local, s_n) : NULL;
        PyObject *shift = margin ? PyObject_GetAttr(g_shift_local, s_n) : NULL;
        if (shift != NULL)
            key = PyTuple_Pack(7, op, sig, flags, ekey, forced, margin, shift);
        Py_XDECREF(forced);
        Py_XDECREF(margin);
        Py_XDECREF(shift);
        if (key == NULL) MISS();
    }
    {
        int recording = global_true(g_recording_mod, s_active);
        if (recording != 0) MISS();  /* inside a recording: the Python path */
        PyObject *plans = global_of(g_call_mod, s_plans);
        if (plans == NULL) MISS();
        if (PyDict_CheckExact(plans)) {
            rec = PyDict_GetItemWithError(plans, key);
            Py_XINCREF(rec);
        } else {  /* a test's stand-in */
            rec = PyObject_CallMethodObjArgs(plans, s_get, key, NULL);
        }
        Py_DECREF(plans);
        if (rec == NULL || (PyObject *)Py_TYPE(rec) != g_recorded_call) MISS();
    }
    if (!bound()) MISS();
    unsigned long long p[MAX_OPERANDS];  /* the addresses, checked first: they need no context */
    ptrs = PyList_New(n);
    if (ptrs == NULL) goto out_error;
    for (Py_ssize_t i = 0; i < n; i++) {
        p[i] = ops[i].kind == K_ABSENT ? 0 : ops[i].ptr;
        PyObject *v = PyLong_FromUnsignedLongLong(p[i]);
        if (v == NULL) goto out_error;
        PyList_SetItem(ptrs, i, v);
    }
    if (plain(rec, p, n) != 1) MISS();
    if (consumer <= 2) {  /* handles 0-2 name the current context's streams: the operands' device's */
        PyObject *dev = PyLong_FromLong(ops[0].device_id);
        PyObject *r = dev ? PyObject_CallMethodObjArgs(g_device_mod, s_get_device, dev, NULL) : NULL;
        Py_XDECREF(dev);
        if (r == NULL) goto out_error;
        Py_DECREF(r);
    }
    rep = field(rec, F_REPLAY);
    if (rep == NULL) MISS();
    /* A call that allocates (its results, or with `out=` still the stream's counters or workspace) asks
     * whether the stream captures: outside capture it makes its memory here (`Replay.native`); a capturing
     * stream's memory is the graph's, which the Python path makes */
    int outside_capture = allocates;
    if (!allocates) {
        PyObject *al = field(rep, F_ALLOCATIONS);
        outside_capture = al == NULL ? -1 : PyObject_IsTrue(al);
        Py_XDECREF(al);
        if (outside_capture < 0) MISS();
    }
    if (outside_capture) {
        int status = 0;
        int err;
        capturing_fn capturing = g_capturing;  /* read with the GIL held (set_driver may change it) */
        if (capturing == NULL) MISS();
        Py_BEGIN_ALLOW_THREADS
        err = capturing((void *)(uintptr_t)consumer, &status);
        Py_END_ALLOW_THREADS
        if (err || status) MISS();  /* the Python path says why */
    }

    /* From here on, the call's work: errors are raised */
    if (foreign) {  /* each producer's queued work before the call's (an event recorded on the producer: the
                     * operands' device current, given back at the end as for any call) */
        PyObject *dev = PyLong_FromLong(ops[0].device_id);
        PyObject *r = dev ? PyObject_CallMethodObjArgs(g_device_mod, s_get_device, dev, NULL) : NULL;
        Py_XDECREF(dev);
        if (r == NULL) goto out_error;
        Py_DECREF(r);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!ops[i].foreign) continue;
            int seen = 0;
            for (Py_ssize_t j = 0; j < i && !seen; j++)
                seen = ops[j].foreign ? PyObject_RichCompareBool(ops[j].stream, ops[i].stream, Py_EQ) : 0;
            if (seen < 0) goto out_error;
            if (seen) continue;
            r = PyObject_CallMethodObjArgs(g_operands_mod, s_stream_wait, consumer_o, ops[i].stream, NULL);
            if (r == NULL) goto out_error;
            Py_DECREF(r);
        }
    }
    result = replay(rep, ops, n, ptrs, ops[0].device_id, consumer, consumer_o, keep);
    if (result == NULL) goto out_error;
    {
        long oi = out_index_o == Py_None ? -1 : PyLong_AsLong(out_index_o);
        if (oi == -1 && PyErr_Occurred()) goto out_error;
        Py_ssize_t nm = PyTuple_Size(more_outs);
        for (Py_ssize_t j = -1; j < nm; j++) {
            long i = j < 0 ? oi : PyLong_AsLong(PyTuple_GetItem(more_outs, j));
            if (i == -1 && PyErr_Occurred()) goto out_error;
            if (i >= 0 && i < n && (ops[i].kind == K_CUDATTN || ops[i].kind == K_JAX) &&
                PyObject_SetAttr(ops[i].kind == K_JAX ? ops[i].adapted : ops[i].obj, s_stream_handle, consumer_o) < 0)
                goto out_error;
        }
        /* a foreign `out` is returned wrapped: the wrapper carries the call's stream (`wrap`) */
    }
    {  /* JAX arrays (their capsules) and operands made on another stream held until the call's work is
        * done (`operands.order_and_hold`) */
        Py_ssize_t nh = 0;
        for (Py_ssize_t i = 0; i < n; i++) nh += ops[i].kind == K_JAX || ops[i].foreign;
        if (nh) {
            PyObject *held = PyTuple_New(nh), *dev = PyLong_FromLong(ops[0].device_id);
            if (held == NULL || dev == NULL) {
                Py_XDECREF(held);
                Py_XDECREF(dev);
                goto out_error;
            }
            for (Py_ssize_t i = 0, j = 0; i < n; i++) {
                if (ops[i].kind != K_JAX && !ops[i].foreign) continue;
                PyObject *ref = ops[i].kind == K_JAX ? ops[i].adapted : ops[i].obj;
                Py_INCREF(ref);
                PyTuple_SetItem(held, j++, ref);
            }
            int r = hold_refs(consumer_o, consumer, held, dev, outside_capture);
            Py_DECREF(held);
            Py_DECREF(dev);
            if (r < 0) goto out_error;
        }
    }
    {
        int pending = global_true(g_lifetime_mod, s_pending);
        if (pending < 0) goto out_error;
        if (pending && release_holds() < 0) goto out_error;
    }
    g_served++;
    goto out;

out_miss:  /* nothing done: the Python path runs the call, and gives the context back itself */
    g_missed[miss_line % MISS_LINES]++;
    Py_CLEAR(result);
    result = miss();  /* NULL: an interrupt to raise */
    goto out;
out_error:
    Py_CLEAR(result);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "cudattn: warm call failed");
out:
    for (Py_ssize_t i = 0; i < n; i++) operand_clear(&ops[i]);
    Py_XDECREF(cur.handle);
    Py_XDECREF(cur.owner);
    Py_XDECREF(keep);
    Py_XDECREF(consumer_o);
    Py_XDECREF(key);
    Py_XDECREF(sig);
    Py_XDECREF(rec);
    Py_XDECREF(rep);
    Py_XDECREF(ptrs);
    /* the thread's context as the caller had it (`_runtime.device`), once the call did its work */
    if (result != g_miss) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int pending = global_true(g_device_mod, s_pending);
        if (pending > 0) {
            PyObject *r = PyObject_CallMethodObjArgs(g_device_mod, s_restore, NULL);
            if (r == NULL) {
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(tb);
                Py_CLEAR(result);
                return NULL;
            }
            Py_DECREF(r);
        } else if (pending < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(et, ev, tb);
    }
    return result;
}
