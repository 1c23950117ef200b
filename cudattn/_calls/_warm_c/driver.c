/* The driver's entry points (from Python: nothing here links CUDA), the event calls of `_arrays.lifetime`
 * through them, and the benchmarks' stamp of the first launch. */
#include "warm.h"

/* The driver's entry points, asked of `bind` until it has them (None where there is no driver yet):
 * (launch, is_capturing, event record, event query, capture-mode exchange). Once they are in place,
 * `bound_hook(True)` hands the event calls to `lifetime` (before then no caller can reach them).
 * 1 bound, 0 not (or an exception pending). */
int bound(void) {
    if (!g_unbound) return g_launch != NULL && g_capturing != NULL;
    PyObject *r = PyObject_CallNoArgs(g_bind);
    unsigned long long a[5] = {0};
    int ok = r != NULL && PyTuple_Check(r) && PyTuple_Size(r) == 5;
    for (Py_ssize_t i = 0; ok && i < 5; i++) ok = as_u64(PyTuple_GetItem(r, i), &a[i]) && a[i];
    Py_XDECREF(r);
    soft_clear();
    if (!ok) return g_launch != NULL && g_capturing != NULL;
    g_launch = (launch_fn)(uintptr_t)a[0];
    g_capturing = (capturing_fn)(uintptr_t)a[1];
    g_record = (record_fn)(uintptr_t)a[2];
    g_query = (query_fn)(uintptr_t)a[3];
    g_exchange = (exchange_fn)(uintptr_t)a[4];
    g_unbound = 0;
    PyObject *h = PyObject_CallFunctionObjArgs(g_bound_hook, Py_True, NULL);
    Py_XDECREF(h);
    soft_clear();
    return !PyErr_Occurred();  /* a KeyboardInterrupt from the hook: raised by the caller's MISS */
}

/* Forget the event entry points (a test's stand-ins may go next): `lifetime` back on cuda.bindings'
 * wrappers first, told by `bound_hook(False)`. */
void unbind_events(void) {
    if (g_record == NULL && g_query == NULL && g_exchange == NULL) return;
    PyObject *h = g_bound_hook ? PyObject_CallFunctionObjArgs(g_bound_hook, Py_False, NULL) : NULL;
    Py_XDECREF(h);
    soft_clear();
    g_record = NULL;
    g_query = NULL;
    g_exchange = NULL;
}


/* set_driver(launch, is_capturing): entry-point addresses (a test's stand-ins); 0, 0 asks `bind` again. */
PyObject *set_driver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    unsigned long long l, c;
    if (nargs != 2 || !as_u64(args[0], &l) || !as_u64(args[1], &c) || !l != !c) {
        PyErr_SetString(PyExc_TypeError, "set_driver(launch: int, is_capturing: int): both addresses, or 0, 0");
        return NULL;
    }
    g_launch = (launch_fn)(uintptr_t)l;
    g_capturing = (capturing_fn)(uintptr_t)c;
    g_unbound = !(l && c);
    unbind_events();  /* bound again with the real ones, from `bind`, once `set_driver(0, 0)` */
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* The event calls of `_arrays.lifetime`, on integer handles, each returning the CUresult as an int
 * (`capture_mode`: (CUresult, the mode before)). Reachable only after `bound` (`bound_hook`). */
PyObject *event_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    unsigned long long ev, st;
    if (nargs != 2 || !as_u64(args[0], &ev) || !as_u64(args[1], &st) || g_record == NULL) {
        PyErr_SetString(PyExc_TypeError, "event_record(event: int, stream: int), once bound");
        return NULL;
    }
    record_fn record = g_record;
    int err;
    Py_BEGIN_ALLOW_THREADS  /* a full launch queue can hold the record */
    err = record((void *)(uintptr_t)ev, (void *)(uintptr_t)st);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

PyObject *event_query(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long ev;
    if (!as_u64(arg, &ev) || g_query == NULL) {
        PyErr_SetString(PyExc_TypeError, "event_query(event: int), once bound");
        return NULL;
    }
    return PyLong_FromLong(g_query((void *)(uintptr_t)ev));
}

PyObject *capture_mode(PyObject *self, PyObject *arg) {
    (void)self;
    long mode = PyLong_Check(arg) ? PyLong_AsLong(arg) : -1;
    if (mode < 0 || mode > 2 || g_exchange == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "capture_mode(mode: 0, 1 or 2), once bound");
        return NULL;
    }
    int m = (int)mode;
    int err = g_exchange(&m);
    return Py_BuildValue("(ii)", err, m);
}

/* bind() -> whether the driver's entry points are in place, asking `bind` for them if not yet */
PyObject *bind_now(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (g_bind == NULL || !g_configured) {
        PyErr_SetString(PyExc_TypeError, "bind() after configure()");
        return NULL;
    }
    int ok = bound();
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

/* arm_stamp(on): note the time of the first launch after each take_stamp, and count launches. */
PyObject *arm_stamp(PyObject *self, PyObject *on) {
    (void)self;
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    g_armed = v;
    g_first_ns = 0;
    g_launches = 0;
    Py_RETURN_NONE;
}

/* take_stamp() -> (perf_counter_ns of the first launch since the last take, or None; launches so far) */
PyObject *take_stamp(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    long long first = g_first_ns;
    g_first_ns = 0;
    if (first) return Py_BuildValue("(LL)", first, g_launches);
    return Py_BuildValue("(OL)", Py_None, g_launches);
}
